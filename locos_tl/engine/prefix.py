"""Layer-prefix reuse: an ablated prompt runs from its lowest ablated layer only.

An intervention at layer ``L`` (a head's query or output, :mod:`locos_tl.engine.ablation`)
acts only forward, so every layer below ``L`` computes exactly what the unablated run
computes: the residual stream entering layer ``L`` (``resid_pre``) and the KV cache of
layers ``0 .. L-1`` are the unablated run's. :func:`capture_prefix` keeps them from one
unablated prefill of a prompt; :func:`prefill_from` then prefills the same prompt under
the open interventions by running layers ``L ..`` on the kept ``resid_pre`` while the
layers below hand over their kept cache (a shallow copy: decoding grows a cache by
concatenation, never in place, so the kept tensors are shared, not duplicated).

Decoding extends the same argument step by step. While an ablated decoding has generated
the unablated tokens, its next step's input and every layer below ``L`` are again the
unablated run's: :func:`trace_decode` keeps the unablated decoding's steps (their
``resid_pre``, logits and KV entries) and :func:`trace_step` runs such a step from
``L``. From the first other token on, the steps run every layer. Sliding-window caches
trim as they slide, so models with such layers reuse the prompt only.

Both run on the SDPA twin (:mod:`locos_tl.engine.twin`): the model's own forward builds
the masks and position embeddings for a fresh cache, and only the decoder layers below
``L`` are replaced for the call by a replay of their kept state. No model code is forked.

Memory: ``resid_pre`` costs ``seq x d_model`` per kept layer (SmolLM2 at 1000 tokens:
2.3 MB in float32; an 8B model at 32k tokens in bf16: 268 MB). :func:`capture_prefix`
keeps only the layers asked for, highest first (they save the most work), up to
``max_bytes``; a prefill from a layer that was not kept returns None and the caller
recomputes the whole prompt. Exactness is a test (``tests/test_prefix.py``): the same
cache, logits and generated tokens as the full recomputation on Llama, Qwen3, Gemma-3
(sliding windows shorter than the prompt) and OLMo-2 (shared query norm).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from locos_tl.engine.forward import fork_cache, new_cache
from locos_tl.engine.interventions import engine, lens_hooks_attached, lowest_intervened_layer
from locos_tl.engine.options import DEFAULT_PREFIX_BYTES
from locos_tl.engine.twin import sdpa_twin
from locos_tl.errors import warn_caller

__all__ = ["DEFAULT_PREFIX_BYTES", "DecodeTrace", "PromptPrefix", "capture_prefix",
           "keep_resid_pre", "prefill_from", "prompt_prefix", "reuse_allowed",
           "start_at_layer", "trace_decode", "trace_step"]



@dataclass(eq=False)
class PromptPrefix:
    """The unablated prefill of one prompt, kept for ablated runs of the same prompt.

    Attributes:
        tokens: ``[1, P]`` the prefilled ids (a decoding's prompt without its last token).
        cache: the unablated KV cache of ``tokens`` (a transformers ``DynamicCache``).
        resid: layer ``L`` -> ``resid_pre`` entering layer ``L``, ``[1, P, d_model]``.
        skipped: layers asked for but not kept (over ``max_bytes``).
    """

    tokens: Int[Tensor, "1 P"]
    cache: Any
    resid: dict[int, Float[Tensor, "1 P d_model"]]
    skipped: list[int] = field(default_factory=list)
    trace: DecodeTrace | None = None

    @property
    def nbytes(self) -> int:
        """Bytes held by the kept ``resid_pre`` tensors (the cache not counted)."""
        return sum(t.numel() * t.element_size() for t in self.resid.values())


@dataclass(eq=False)
class DecodeTrace:
    """The unablated greedy continuation of a prompt, step by step, kept so an ablated
    decoding that generates the same tokens computes its steps from its lowest ablated
    layer too (:func:`trace_step`).

    Attributes:
        tokens: ``y_0 .. y_{T-1}``, the unablated argmax of each step.
        logits: ``[T, d_vocab]`` each step's logits.
        resid: layer ``L`` -> ``[1, T, d_model]`` each step's ``resid_pre`` of ``L``.
        keys, values: per layer, the steps' cache entries ``[1, n_kv, T, d_head]``.
    """

    tokens: list[int]
    logits: Float[Tensor, "T d_vocab"]
    resid: dict[int, Float[Tensor, "1 T d_model"]]
    keys: list[Tensor]
    values: list[Tensor]


def _decoder_layers(twin: Any) -> dict[int, torch.nn.Module]:
    out: dict[int, torch.nn.Module] = {}
    for name, mod in twin.named_modules():
        m = re.search(r"(?:^|\.)layers\.(\d+)$", name)
        if m:
            out[int(m.group(1))] = mod
    return out


@torch.no_grad()
def capture_prefix(model: Any, tokens: Tensor, layers: Iterable[int], *,
                   max_bytes: int = DEFAULT_PREFIX_BYTES) -> PromptPrefix | None:
    """Prefill ``tokens`` unablated on the SDPA twin, keeping ``resid_pre`` of ``layers``.

    Args:
        model: a TransformerBridge.
        tokens: ``[1, P]`` ids, ``P >= 1``.
        layers: the layers later prefills start from (each head set's lowest ablated
            layer); layer 0 and layers ``>= n_layers`` need no ``resid_pre`` and are
            dropped.
        max_bytes: cap on the kept ``resid_pre``; the highest layers are kept first.

    Returns:
        The prefix, or None when the model has no SDPA twin (then nothing is reused).

    Raises:
        ValueError: a hook is attached to the model (the prefix must be unablated).
    """
    if lens_hooks_attached(model):
        raise ValueError("capture_prefix runs the unablated prompt: call it outside any "
                         "ablate()/intervene() block and with no hook attached")
    twin = sdpa_twin(model)
    if twin is None or tokens.shape[1] == 0:
        return None
    n_layers = int(model.cfg.n_layers)
    wanted = sorted({int(l) for l in layers if 0 < int(l) < n_layers}, reverse=True)
    cache = new_cache(model)
    with keep_resid_pre(model, wanted, tokens.shape[1], max_bytes=max_bytes) as resid:
        twin(tokens, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return PromptPrefix(tokens=tokens, cache=cache, resid=resid,
                        skipped=[l for l in wanted if l not in resid])


@contextmanager
def keep_resid_pre(model: Any, layers: Iterable[int], n_pos: int, *,
                   max_bytes: int = DEFAULT_PREFIX_BYTES
                   ) -> Iterator[dict[int, Float[Tensor, "batch pos d_model"]]]:
    """Within the block, each forward of the SDPA twin stores the residual stream
    entering each of ``layers`` (``resid_pre``, a clone) in the yielded dict, replacing
    what an earlier forward stored. Layers are kept highest first while
    ``n_pos x d_model`` per layer fits in ``max_bytes``; the others are not stored.
    Nothing is stored when the model has no twin."""
    resid: dict[int, Tensor] = {}
    twin = sdpa_twin(model)
    if twin is None:
        yield resid
        return
    width = int(n_pos) * int(model.cfg.d_model) * next(twin.parameters()).element_size()
    wanted = sorted({int(l) for l in layers}, reverse=True)
    keep = [l for i, l in enumerate(wanted) if (i + 1) * width <= max_bytes]
    mods = _decoder_layers(twin)

    def hook(l: int) -> Any:
        def pre(_mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            h = args[0] if args else kwargs["hidden_states"]
            resid[l] = h.detach().clone()

        return pre

    handles = [mods[l].register_forward_pre_hook(hook(l), with_kwargs=True)
               for l in keep if l in mods]
    try:
        yield resid
    finally:
        for h in handles:
            h.remove()


@contextmanager
def start_at_layer(model: Any, start: int, resid: Float[Tensor, "1 pos d_model"], *,
                   on_skip: Callable[[int], None] | None = None) -> Iterator[None]:
    """Within the block, the SDPA twin's decoder layers below ``start`` do no work:
    layer ``start - 1`` returns ``resid`` (the kept ``resid_pre`` of layer ``start``,
    repeated along the batch axis when the forward is batched) and the layers below it
    pass their input on. ``on_skip(l)`` runs in place of each skipped layer (to hand
    over its kept KV cache). Exact only when the forward's positions and its inputs
    below ``start`` are those ``resid`` was kept from; the caller checks that."""
    twin = sdpa_twin(model)
    mods = _decoder_layers(twin)

    def replay(l: int) -> Any:
        def forward(hidden_states: Tensor, *args: Any, **kwargs: Any) -> Tensor:
            if on_skip is not None:
                on_skip(l)
            if l != start - 1:
                return hidden_states
            if resid.shape[0] == hidden_states.shape[0]:
                return resid
            return resid.expand(hidden_states.shape[0], -1, -1).contiguous()

        return forward

    own = {l: mods[l].__dict__.get("forward") for l in range(start)}
    try:
        for l in range(start):
            mods[l].forward = replay(l)
        yield
    finally:
        for l, fn in own.items():
            if fn is None:
                del mods[l].forward
            else:
                mods[l].forward = fn


def reuse_allowed(model: Any, reuse_prefix: bool, caller: str) -> bool:
    """Whether a sweep called as ``caller`` can reuse unablated prefixes: ``reuse_prefix``,
    unless hooks are already attached to ``model`` when the sweep starts (an outer
    :func:`locos_tl.ablate` / :func:`~locos_tl.engine.interventions.intervene` block, a
    steering hook from ``model.hooks(...)`` or ``add_hook``).

    The prefix :func:`capture_prefix` keeps is the prompt with no hook at all; under an
    outer hook it would not be what every head set's run starts from, so the sweep
    recomputes each prompt and decoding in full under the outer hooks plus its own
    ablation, the records of ``reuse_prefix=False``.

    Warns:
        UserWarning: once, when ``reuse_prefix`` is on and hooks are attached (it is
            then turned off; pass ``reuse_prefix=False`` to silence the warning).
    """
    if not reuse_prefix or not lens_hooks_attached(model):
        return bool(reuse_prefix)
    warn_caller(f"{caller}(): hooks are already attached to the model (an outer "
                "ablate()/intervene() block or your own hooks); the unablated prompt "
                "prefix cannot be reused under them, so every prompt and decoding is "
                "recomputed with those hooks active (the records of reuse_prefix=False). "
                "Pass reuse_prefix=False to silence this warning", UserWarning)
    return False


def prompt_prefix(model: Any, tokens: Sequence[int], head_sets: Sequence[Sequence[Any]], *,
                  max_bytes: int = DEFAULT_PREFIX_BYTES, decode_steps: int = 0,
                  stop: Callable[[int, int], bool] | None = None) -> PromptPrefix | None:
    """The prefix a decoding of ``tokens`` (a whole prompt, its last token included)
    reuses under each of ``head_sets`` (``(layer, head)`` pairs): ``resid_pre`` kept at
    each set's lowest layer, and with ``decode_steps`` the unablated decoding's first
    steps, to its ``stop`` (:func:`trace_decode`). None when it would serve fewer than two head sets
    (nothing to reuse), the prompt has fewer than two tokens, or no twin exists."""
    if len(head_sets) < 2 or len(tokens) < 2:
        return None
    device = next(model.original_model.parameters()).device
    ids = torch.tensor([[int(x) for x in tokens[:-1]]], dtype=torch.long, device=device)
    starts = [min(int(h[0]) for h in heads) for heads in head_sets if len(heads)]
    prefix = capture_prefix(model, ids, starts, max_bytes=max_bytes)
    if prefix is not None and decode_steps > 0:
        prefix.trace = trace_decode(model, prefix, int(tokens[-1]), decode_steps, stop=stop)
    return prefix


@torch.no_grad()
def prefill_from(model: Any, prefix: PromptPrefix, tokens: Tensor, *,
                 chunk_size: int | None = None) -> Any | None:
    """The KV cache :func:`locos_tl.engine.forward.prefill` gives ``tokens`` under the
    interventions open now, computed from their lowest layer up on ``prefix``.

    With no intervention open the cache is the prefix's own (a shallow copy). Returns
    None, and the caller prefills in full, when the reuse would not be exact or is not
    possible: ``tokens`` differ from the prefix's, a ``chunk_size`` shorter than them
    asks for a chunked prefill, a hook the twin cannot run is attached, or the lowest
    intervened layer's ``resid_pre`` was not kept.
    """
    if tokens.shape != prefix.tokens.shape or not torch.equal(tokens, prefix.tokens):
        return None
    if chunk_size is not None and chunk_size < tokens.shape[1]:
        return None
    if engine(model) != "twin":
        return None
    n_layers = int(model.cfg.n_layers)
    start = lowest_intervened_layer(model)
    start = n_layers if start is None else start
    if start >= n_layers:
        return fork_cache(model, prefix.cache)
    cache = new_cache(model)
    if start == 0 or start not in prefix.resid:
        return None

    def hand_over(l: int) -> None:
        cache.layers[l] = copy.copy(prefix.cache.layers[l])

    with start_at_layer(model, start, prefix.resid[start], on_skip=hand_over):
        sdpa_twin(model)(tokens, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return cache


def _full_attention(cache: Any, layers: int) -> bool:
    return all(not getattr(cache.layers[l], "is_sliding", False)
               and hasattr(cache.layers[l], "keys") for l in range(layers))


@torch.no_grad()
def trace_decode(model: Any, prefix: PromptPrefix, last_id: int, n_steps: int, *,
                 stop: Callable[[int, int], bool] | None = None) -> DecodeTrace | None:
    """Decode at most ``n_steps`` unablated greedy steps after ``prefix`` (whose last
    prompt token is ``last_id``) on the SDPA twin, as
    :func:`locos_tl.engine.decode.greedy_decode` does, keeping what :func:`trace_step`
    reuses. ``stop(t, y)`` (:func:`locos_tl.engine.stops.stop_predicate`, the decodings'
    own rules) ends it where the unablated decoding ends: a decoding that follows it
    stops there too. It also ends at a non-finite logit.

    Returns:
        The trace, or None when the twin is missing or a layer has a sliding-window
        cache (its entries are trimmed as it slides: not kept, so a model with sliding
        windows reuses the prompt only).
    """
    twin = sdpa_twin(model)
    n_layers = int(model.cfg.n_layers)
    if twin is None or not _full_attention(prefix.cache, n_layers):
        return None
    cache = fork_cache(model, prefix.cache)
    n_prompt = int(prefix.tokens.shape[1])
    rows: dict[int, list[Tensor]] = {l: [] for l in prefix.resid}
    mods = _decoder_layers(twin)

    def keep(l: int) -> Any:
        def pre(_mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            h = args[0] if args else kwargs["hidden_states"]
            rows[l].append(h.detach().clone())

        return pre

    handles = [mods[l].register_forward_pre_hook(keep(l), with_kwargs=True) for l in rows]
    tokens: list[int] = []
    logits: list[Tensor] = []
    step = prefix.tokens.new_tensor([[int(last_id)]])
    try:
        for t in range(n_steps):
            out = twin(step, past_key_values=cache, use_cache=True, logits_to_keep=1)
            row = out.logits[0, -1]
            if not bool(torch.isfinite(row).all()):
                break
            logits.append(row)
            tokens.append(int(row.argmax()))
            if stop is not None and stop(t, tokens[-1]):
                break
            step = step.new_tensor([[tokens[-1]]])
    finally:
        for h in handles:
            h.remove()
    n = len(tokens)
    if n == 0:
        return None
    return DecodeTrace(
        tokens=tokens, logits=torch.stack(logits),
        resid={l: torch.cat(r[:n], dim=1) for l, r in rows.items()},
        keys=[cache.layers[l].keys[..., n_prompt:, :].clone() for l in range(n_layers)],
        values=[cache.layers[l].values[..., n_prompt:, :].clone() for l in range(n_layers)])


def trace_step(model: Any, prefix: PromptPrefix, cache: Any, t: int,
               step_input: Tensor) -> Tensor | None:
    """Decoding step ``t`` of an ablated decoding whose tokens so far are the trace's
    (``y_0 .. y_{t-1}``; the caller checks), computed from the lowest intervened layer
    ``L``: the layers below ``L`` hand over the prompt's cache plus the trace's entries
    of steps ``0 .. t`` and layer ``L`` starts on the trace's ``resid_pre``. With no
    intervention open the step is the trace's own. Returns the step's logits
    ``[d_vocab]`` (the same as the full step: the same kernels on the same inputs), or
    None when the step cannot be reused (no trace, ``t`` beyond it, ``L``'s
    ``resid_pre`` not kept, a hook the twin cannot run)."""
    tr = prefix.trace
    if tr is None or t >= len(tr.tokens) or engine(model) != "twin":
        return None
    n_layers = int(model.cfg.n_layers)
    start = lowest_intervened_layer(model)
    start = n_layers if start is None else start
    if start == 0 or (start < n_layers and start not in tr.resid):
        return None

    def hand_over(l: int) -> None:
        own = prefix.cache.layers[l]
        layer = copy.copy(own)
        layer.keys = torch.cat([own.keys, tr.keys[l][..., : t + 1, :]], dim=-2)
        layer.values = torch.cat([own.values, tr.values[l][..., : t + 1, :]], dim=-2)
        cache.layers[l] = layer

    if start >= n_layers:  # no intervention: the trace's step, its cache entries included
        for l in range(n_layers):
            hand_over(l)
        return tr.logits[t]
    with start_at_layer(model, start, tr.resid[start][:, t : t + 1], on_skip=hand_over):
        out = sdpa_twin(model)(step_input, past_key_values=cache, use_cache=True,
                               logits_to_keep=1)
    return out.logits[0, -1]
