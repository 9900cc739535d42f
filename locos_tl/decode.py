"""Greedy decoding that exposes, at every step, the attention rows and values of all heads.

One pass feeds every detector: the prompt is prefilled once (fast SDPA twin of the HF
model sharing the bridge's weight tensors, or the bridge itself in query chunks), then
each decode step runs on one of two engines (``decode_engine``): the *eager twin* (a
plain HF model sharing the bridge's tensors, :mod:`locos_tl.twin`, called with
``output_attentions=True``: a query of length 1 costs one ``[n_heads, N]`` row per layer;
norm scales from light module pre-hooks), or the TransformerBridge with hooks on
``blocks.{l}.attn.hook_pattern`` (only the query row is kept) and the norm scales -- the
reference every fast path is tested against (``tests/test_fast_decode.py``), used
whenever a hook is attached to the bridge or no twin exists. Values are read from the KV
cache (they equal ``hook_v``). A step makes one host read (the token id, which decides
stopping; a non-finite check is folded into it); rows, values and phi stay on the device.
Rows and values are aligned to absolute key positions on every layer: a sliding-window
layer's row covers only the last ``window`` keys, and its cache drops the oldest of them
during the step's update, so its values are the cache before the update plus the step's
new value (the authors' release indexes the window-sliced row with absolute positions;
docs/concepts.md). Memory is linear in context length: no ``N x N`` tensor is kept, and
the bridge's eager attention sees at most ``chunk_size x N`` scores at a time (SDPA
twin: one causal call, linear memory).

Decoding step ``t`` is the forward position whose logits choose ``y_t``: step 1 is the
last prompt token with ``N`` keys, step ``t`` has ``N + t - 1`` keys (docs/concepts.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, get_args

import torch
from jaxtyping import Float
from torch import Tensor

from locos_tl.answers import think_token_ids
from locos_tl.errors import LocosError, NonFiniteError, TrialError
from locos_tl.interventions import engine as intervention_engine
from locos_tl.interventions import hooks_reproducible, lens_hooks_attached
from locos_tl.kernel import phi_layer
from locos_tl.twin import sdpa_twin, twin_info
from locos_tl.unembed import AnswerDirections

log = logging.getLogger(__name__)

StopRule = Literal["newline_token", "contains_newline"]
STOP_RULES: tuple[str, ...] = get_args(StopRule)
DecodeEngine = Literal["auto", "twin", "bridge"]
DECODE_ENGINES: tuple[str, ...] = get_args(DecodeEngine)


def check_stop_rule(rule: str) -> StopRule:
    """Validate a stop rule name.

    Raises:
        ValueError: not one of :data:`STOP_RULES`.
    """
    if rule not in STOP_RULES:
        raise ValueError(f"unknown stop rule {rule!r}; use one of {STOP_RULES}")
    return rule  # type: ignore[return-value]


def is_newline_stop(text: str, rule: str = "newline_token") -> bool:
    """Whether a generated token whose decoded text is ``text`` stops decoding.

    ``"newline_token"`` (default; the authors' release, docs/concepts.md protocol table,
    Gema, Alex & Minervini 2026, arXiv 2607.01002): only the bare newline token, whose
    text is exactly ``"\\n"`` (also what the byte-fallback token ``<0x0A>`` decodes
    to); a token that merely contains a newline (``".\\n"``, ``"\\n\\n"``) does not
    stop. ``"contains_newline"`` (this project's earlier rule): any token whose text
    contains ``"\\n"``.

    Raises:
        ValueError: unknown rule.
    """
    if rule == "newline_token":
        return text == "\n"
    if rule == "contains_newline":
        return "\n" in text
    raise ValueError(f"unknown stop rule {rule!r}; use one of {STOP_RULES}")


@dataclass
class DecodeStep:
    """Everything detectors need about one decoding step (batch size 1).

    Attributes:
        t: 0-based index of the generated token this step chose.
        token: the greedy token ``y_t``.
        key_tokens: ids of the ``N_t`` key positions (prompt + earlier generated tokens).
        pattern: attention rows of the query, ``[n_layers, n_heads, N_t]`` (float32,
            probability; zero-padded on the left for sliding-window layers).
        values: per layer, ``[N_t, n_kv_heads, d_head]`` values at absolute key
            positions (zeros before a sliding window, where the pattern is zero too).
        scales: norm ``hook_scale`` values at the query position (``exact`` variant),
            0-d device tensors (no host read).
        logits: the step's output logits, ``[d_vocab]``.
        thinking: this step's token belongs to a ``<think> ... </think>`` block (its
            markers included); such a step is never an answer step.
    """

    t: int
    token: int
    key_tokens: Tensor
    pattern: Float[Tensor, "n_layers n_heads pos"]
    values: Sequence[Tensor]
    scales: dict[str, Any]
    logits: Tensor
    thinking: bool = False
    _W_O: list[Tensor] = field(repr=False, default_factory=list)
    _directions: AnswerDirections | None = field(repr=False, default=None)
    _kv: list[Tensor] | None = field(repr=False, default=None)  # [n_kv, K_l, d_head]

    @property
    def n_keys(self) -> int:
        return int(self.pattern.shape[-1])

    @cached_property
    def phi(self) -> Float[Tensor, "n_layers n_heads pos"]:
        """LOCOS ``phi[l, h, j]`` for ``y_t`` (Eq. 2), logits, computed once per step."""
        if self._directions is None:
            raise RuntimeError("this step was captured without answer directions")
        u = self._directions(self.token, self.scales)
        if self._kv is not None:
            return _phi_all_layers(self.pattern, self._kv, self._W_O, u)
        out = []
        for layer, v in enumerate(self.values):
            # under a device_map split each layer's values and W_O live on that layer's
            # device: compute there, gather the [n_heads, pos] result on pattern's device
            dev = v.device
            phi = phi_layer(self.pattern[layer].to(dev), v, self._W_O[layer].to(dev),
                            u[layer].to(dev))
            out.append(phi.to(self.pattern.device))
        return torch.stack(out)


class _PaddedValues(Sequence[Tensor]):
    """``DecodeStep.values`` without copies: layer ``l``'s ``[n_keys, n_kv, d_head]``
    values at absolute positions, built (zeros before a sliding window) only when read."""

    def __init__(self, kv: list[Tensor], n_keys: int) -> None:
        self._kv, self._n = kv, n_keys

    def __len__(self) -> int:
        return len(self._kv)

    def __getitem__(self, layer: int) -> Tensor:  # type: ignore[override]
        v = self._kv[layer].transpose(0, 1)  # [K, n_kv, d_head]
        if v.shape[0] == self._n:
            return v
        return torch.cat([v.new_zeros(self._n - v.shape[0], *v.shape[1:]), v])


def _phi_all_layers(
    pattern: Float[Tensor, "n_layers n_heads pos"],
    kv: list[Tensor],
    W_O: list[Tensor],
    u: Float[Tensor, "n_layers d_model"],
) -> Float[Tensor, "n_layers n_heads pos"]:
    """Eq. 2 for every layer of one step: ``phi = alpha * (v . (W_O[h] @ u))``.

    ``kv[l]`` is the layer's ``[n_kv, K_l, d_head]`` values of its last ``K_l`` keys (a
    view of the KV cache, never copied); products run in the values' dtype (float32
    accumulation), as :func:`locos_tl.kernel.phi_layer` in float32. A layer whose
    window is shorter than the row is zero before it, as its pattern is.
    """
    L, H, n = pattern.shape
    vws = []
    for l, v in enumerate(kv):
        W = W_O[l]  # [H, d_head, d_model]
        ul = u[l]
        if ul.device != W.device or ul.dtype != W.dtype:
            ul = ul.to(W.device, W.dtype)
        w = torch.mv(W.reshape(-1, W.shape[-1]), ul)  # [H * d_head] (a view of W_O: no copy)
        if w.device != v.device:
            w = w.to(v.device)
        n_kv = v.shape[0]
        vw = torch.bmm(w.view(n_kv, H // n_kv, -1), v.transpose(-1, -2))  # [kv, g, K]
        if vw.device != pattern.device:
            vw = vw.to(pattern.device)
        vws.append(vw.view(H, -1))
    if all(x.shape[-1] == n for x in vws):
        vw_all = torch.stack(vws)
        if vw_all.dtype != torch.float32:
            vw_all = vw_all.to(torch.float32)
    else:
        vw_all = pattern.new_zeros(L, H, n)
        for l, x in enumerate(vws):
            vw_all[l, :, n - x.shape[-1] :] = x
    return pattern * vw_all


@dataclass
class DecodeResult:
    """Output of :func:`greedy_decode`.

    Attributes:
        prompt_len: prompt tokens ``N``.
        generated: generated ids, the stop token included.
        text: the response: ``generated[response_start:]`` without the stop token,
            decoded (special tokens skipped) and stripped; no thinking text.
        stopped_by: ``"eos"``, ``"newline"`` or ``"max_new_tokens"``.
        response_start: index in ``generated`` of the first step after the reasoning
            block (0 without one; ``len(generated)`` when the block never closed).
        thinking: the decoded reasoning block (markers excluded), ``""`` without one.
    """

    prompt_len: int
    generated: list[int]
    text: str
    stopped_by: str
    response_start: int = 0
    thinking: str = ""


@dataclass
class _StopState:
    """One trial's stop and thinking state while decoding (:class:`_StopRules`).

    ``in_think``: inside a ``<think>`` block; ``start``: the response start in
    ``generated`` (None while thinking); ``after_think``: only whitespace generated
    since the block closed; ``stopped_by`` as in :class:`DecodeResult`.
    """

    in_think: bool = False
    start: int | None = 0
    after_think: bool = False
    stopped_by: str = "max_new_tokens"


@dataclass(frozen=True)
class _StopRules:
    """:func:`greedy_decode`'s stop and thinking rules, shared with
    :mod:`locos_tl.batch` so both decide every token alike."""

    tok: Any
    stop_ids: frozenset[int]
    think_open: frozenset[int]
    think_close: frozenset[int]
    stop_rule: str = "newline_token"
    stop_at_newline: bool = True

    @classmethod
    def of(cls, model: Any, stop_rule: str, thinking: bool, *, stop_at_eos: bool = True,
           stop_at_newline: bool = True) -> _StopRules:
        tok = model.tokenizer
        think_open, think_close = think_token_ids(tok) if thinking else (frozenset(), frozenset())
        return cls(tok, frozenset(_stop_ids(model)) if stop_at_eos else frozenset(),
                   think_open, think_close, stop_rule, stop_at_newline)

    def initial(self, prompt: Tensor) -> _StopState:
        """The state after the prompt ``[N]`` (does it leave a thinking block open?)."""
        in_think = False
        for i in prompt.tolist() if self.think_open or self.think_close else ():
            if i in self.think_open:
                in_think = True
            elif i in self.think_close:
                in_think = False
        return _StopState(in_think=in_think, start=None if in_think else 0)

    def is_thinking(self, state: _StopState, y: int) -> bool:
        """Whether token ``y`` belongs to a thinking block (its markers included)."""
        return state.in_think or y in self.think_open or y in self.think_close

    def advance(self, state: _StopState, t: int, y: int, step_thinking: bool) -> bool:
        """Update ``state`` after token ``y`` at step ``t``; True when decoding stops
        here (``state.stopped_by`` says why)."""
        if y in self.stop_ids:
            state.stopped_by = "eos"
            return True
        if y in self.think_open:
            state.in_think, state.start, state.after_think = True, None, False
        elif y in self.think_close:
            state.in_think, state.start, state.after_think = False, t + 1, True
        if step_thinking:
            return False
        text_y = self.tok.decode([y])
        if state.after_think and not text_y.strip():  # "</think>\n\n": part of the block
            return False
        state.after_think = False
        if self.stop_at_newline and is_newline_stop(text_y, self.stop_rule):
            state.stopped_by = "newline"
            return True
        return False

    def result(self, state: _StopState, prompt_len: int, generated: list[int]) -> DecodeResult:
        """The :class:`DecodeResult` of a finished decode."""
        tok = self.tok
        n_gen = len(generated)
        start = n_gen if state.start is None else state.start
        end = n_gen - 1 if state.stopped_by != "max_new_tokens" else n_gen
        text = (tok.decode(generated[start:end], skip_special_tokens=True).strip()
                if end > start else "")
        think_ids = [g for g in generated[: min(start, end)]
                     if g not in self.think_open and g not in self.think_close]
        thought = tok.decode(think_ids, skip_special_tokens=True).strip() if think_ids else ""
        return DecodeResult(prompt_len=prompt_len, generated=generated, text=text,
                            stopped_by=state.stopped_by, response_start=start,
                            thinking=thought)


def _hf_model(model: Any) -> Any:
    return model.original_model


def _new_cache(model: Any) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=_hf_model(model).config)


@torch.no_grad()
def prefill(
    model: Any, tokens: Tensor, *, mode: str = "auto", chunk_size: int | None = None
) -> Any:
    """Fill a fresh KV cache with ``tokens`` (``[1, P]``); returns the cache.

    Args:
        mode: ``"sdpa"`` (twin model, fastest), ``"bridge"`` (the bridge's own eager
            forward), or ``"auto"`` (twin when available and every attached hook is a
            registered intervention it reproduces, :mod:`locos_tl.interventions`).
        chunk_size: queries per forward. Default: the whole prompt for the SDPA twin
            (its causal kernel never forms an ``N x N`` tensor, so memory is linear and
            one call is fastest) and 1024 for the bridge, whose eager attention forms
            ``[n_heads, chunk, N]`` scores.

    Raises:
        ValueError: unknown mode.
    """
    if mode not in ("auto", "sdpa", "bridge"):
        raise ValueError(f"unknown prefill mode {mode!r}; use 'auto', 'sdpa' or 'bridge'")
    cache = _new_cache(model)
    if tokens.shape[1] == 0:
        return cache
    if mode == "auto" and not hooks_reproducible(model):  # a hook the twin cannot run
        mode = "bridge"  # (e.g. a user's TL hook): prefill through the bridge, where it fires
    twin = sdpa_twin(model) if mode in ("auto", "sdpa") else None
    if mode == "sdpa" and twin is None:
        raise ValueError("no SDPA twin can be built for this model; use prefill='bridge'")
    if chunk_size is None:
        chunk_size = tokens.shape[1] if twin is not None else 1024
    for i in range(0, tokens.shape[1], chunk_size):
        chunk = tokens[:, i : i + chunk_size]
        if twin is not None:
            twin(chunk, past_key_values=cache, use_cache=True, logits_to_keep=1)
        else:
            model(chunk, return_type=None, past_key_values=cache, use_cache=True)
    return cache


@torch.no_grad()
def prefill_with_rows(
    model: Any,
    tokens: Tensor,
    n_rows: int,
    on_rows: Callable[[int, Tensor], None] | None,
    *,
    mode: str = "auto",
    chunk_size: int | None = None,
) -> Any:
    """:func:`prefill` ``tokens`` (``[1, P]``), reading the attention rows of the last
    ``n_rows`` positions on the way; returns the cache.

    The first ``P - n_rows`` tokens are prefilled as usual, the last ``n_rows`` run
    through the bridge in one forward on that cache, whose ``hook_pattern`` gives their
    rows (``n_rows x P`` per head, no ``P x P`` tensor). ``on_rows(layer, rows)`` gets
    ``rows`` ``[n_heads, n_rows, P]`` (float32, probability) at absolute key positions
    (a sliding-window layer's row is right-aligned, zeros before the window). The cache
    equals :func:`prefill`'s.
    """
    n_rows = min(n_rows, tokens.shape[1]) if on_rows is not None else 0
    P = tokens.shape[1]
    cache = prefill(model, tokens[:, : P - n_rows], mode=mode, chunk_size=chunk_size)
    if n_rows == 0:
        return cache

    def keep(pattern: Tensor, hook: Any) -> None:
        got = pattern[0].detach().to(torch.float32)  # [n_heads, n_rows, K]
        full = got.new_zeros(got.shape[0], n_rows, P)
        full[..., P - got.shape[-1] :] = got
        on_rows(int(hook.name.split(".")[1]), full)  # type: ignore[misc]

    hooks = [(f"blocks.{l}.attn.hook_pattern", keep) for l in range(int(model.cfg.n_layers))]
    model.run_with_hooks(tokens[:, P - n_rows :], fwd_hooks=hooks, past_key_values=cache,
                         use_cache=True, return_type=None)
    return cache


@dataclass(frozen=True)
class StepEngine:
    """Which engine runs the decode steps, and why not a faster one.

    Attributes:
        path: ``"eager_twin"`` (attention rows from the eager twin), ``"sdpa_twin"``
            (no rows needed: plain generation, interventions as module hooks) or
            ``"bridge"`` (the TransformerBridge, the reference).
        twin: the twin model (None for the bridge).
        reason: why the bridge runs (None on a twin).
    """

    path: str
    twin: Any | None = None
    reason: str | None = None


def step_engine(model: Any, decode_engine: str = "auto", *, rows: bool = True) -> StepEngine:
    """Choose the engine of :func:`greedy_decode`'s steps.

    ``"auto"``: with ``rows`` (a step callback needs attention rows), the eager twin
    when no hook of any kind is attached to the bridge (its hooks would not fire on the
    twin); without rows, the SDPA twin when it reproduces every attached hook
    (:func:`locos_tl.interventions.engine`). Otherwise the bridge, with a
    ``RuntimeWarning`` naming the reason when a user's hook or a missing twin causes it
    (running inside a locos_tl intervention is logged at INFO).

    Raises:
        ValueError: unknown ``decode_engine``; ``"twin"`` when no twin exists or a hook
            is attached (it would not fire on the twin).
    """
    if decode_engine not in DECODE_ENGINES:
        raise ValueError(f"unknown decode_engine {decode_engine!r}; use one of {DECODE_ENGINES}")
    if decode_engine == "bridge":
        return StepEngine("bridge", None, "decode_engine='bridge' was asked")
    if not rows:
        if intervention_engine(model) == "twin":
            return StepEngine("sdpa_twin", sdpa_twin(model))
        info = twin_info(model, "sdpa")
        reason = info.reason or "a hook the SDPA twin cannot run is attached to the bridge"
        hooked = info.twin is not None
    else:
        hooked = lens_hooks_attached(model)
        info = twin_info(model, "eager") if not hooked else None
        if info is not None and info.twin is not None:
            return StepEngine("eager_twin", info.twin)
        reason = (info.reason if info is not None else
                  "a hook is attached to the bridge (it fires only there)")
    if decode_engine == "twin":
        raise ValueError(f"decode_engine='twin' impossible: {reason}")
    if hooked and hooks_reproducible(model):  # a locos_tl intervention: expected
        log.info("decode steps run through the TransformerBridge: %s", reason)
    elif hooked:
        import warnings

        warnings.warn(f"decode steps run through the TransformerBridge (slower, same values):"
                      f" {reason}", RuntimeWarning, stacklevel=3)
    return StepEngine("bridge", None, reason)


def engine_paths(
    model: Any, prefill_mode: str = "auto", decode_engine: str = "auto", *, rows: bool = True
) -> dict[str, Any]:
    """Which prefill and decode-step paths :func:`greedy_decode` takes on ``model`` now,
    with the fallback reasons (recorded in ``meta.json`` and ``HeadScores.meta``).

    Returns:
        ``{"prefill": "sdpa_twin" | "bridge", "prefill_reason": str | None,
        "decode": "eager_twin" | "sdpa_twin" | "bridge", "decode_reason": str | None}``.
    """
    if prefill_mode == "bridge":
        pre, pre_reason = "bridge", "prefill_mode='bridge' was asked"
    elif prefill_mode == "auto" and not hooks_reproducible(model):
        pre, pre_reason = "bridge", "a hook the SDPA twin cannot run is attached to the bridge"
    else:
        info = twin_info(model, "sdpa")
        pre, pre_reason = info.path, info.reason
    eng = step_engine(model, decode_engine, rows=rows)
    return {"prefill": pre, "prefill_reason": pre_reason, "decode": eng.path,
            "decode_reason": eng.reason}


class _TwinScales:
    """Light forward pre-hooks on the twin's norms: ``hook_scale`` at the last position.

    The same value TransformerLens' norm bridge gives ``hook_scale`` (float32
    ``sqrt(mean(x^2) + eps)``, ``x`` centred first for a LayerNorm), one per batch row
    (``[B]`` device tensor; :func:`greedy_decode` and :mod:`locos_tl.batch` share it);
    names are the TransformerLens hook names (``ln_final.hook_scale``,
    ``blocks.{l}.ln1_post.hook_scale``).

    Raises:
        LocosError: a norm with no counterpart in the twin.
    """

    def __init__(self, model: Any, twin: Any, names: Sequence[str]) -> None:
        self.values: dict[str, Tensor] = {}
        self.handles: list[Any] = []
        if not names:
            return
        hf = _hf_model(model)
        where = {id(m): n.replace("._original_component", "") for n, m in hf.named_modules()}
        layernorm = str(getattr(model.cfg, "normalization_type", "RMS")).upper().startswith("LN")
        for name in names:
            comp = model.get_submodule(name.rsplit(".hook_scale", 1)[0])
            orig = getattr(comp, "original_component", comp)
            path = where.get(id(orig))
            if path is None:
                raise LocosError(f"{name}: its norm has no counterpart in the twin")
            mod = twin.get_submodule(path)
            eps = next((e for e in (getattr(orig, "eps", None),
                                    getattr(orig, "variance_epsilon", None)) if e is not None),
                       getattr(model.cfg, "eps", 1e-5))
            self.handles.append(mod.register_forward_pre_hook(
                self._hook(name, float(eps), layernorm)))

    def _hook(self, name: str, eps: float, layernorm: bool) -> Callable:
        def pre(_mod: Any, args: tuple[Any, ...]) -> None:
            x = args[0][:, -1].to(torch.float32)  # [B, d_model], the query position
            if layernorm:
                x = x - x.mean(-1, keepdim=True)
            self.values[name] = (x.pow(2).mean(-1) + eps).sqrt()

        return pre

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


def _cache_values(cache: Any, layer: int) -> Tensor | None:
    """The layer's cached values ``[1, n_kv, K, d_head]`` (None before the first update)."""
    vals = getattr(cache.layers[layer], "values", None) if layer < len(cache.layers) else None
    return vals if isinstance(vals, Tensor) else None


def _sliding_layers(cache: Any, n_layers: int) -> list[bool]:
    """Per layer, whether its cache is a sliding-window layer (``is_sliding``), the
    layers whose pre-step values :func:`_step_values` needs; a full layer's old values
    are never kept alive past its update."""
    return [bool(getattr(cache.layers[l], "is_sliding", False))
            if l < len(cache.layers) else False for l in range(n_layers)]


def _pre_step_values(cache: Any, sliding: Sequence[bool]) -> list[Tensor | None]:
    """The ``before`` of :func:`_step_values` for every layer: a sliding layer's cache
    values just before the step (small), None for a full layer."""
    return [_cache_values(cache, l) if s else None for l, s in enumerate(sliding)]


def _step_values(before: Tensor | None, after: Tensor, n_row: int, layer: int) -> Tensor:
    """Values of the ``n_row`` keys one decode step's query attended to, ``[n_kv, n_row,
    d_head]`` (a view of the cache when it holds them all), oldest first (absolute
    positions ``N_t - n_row .. N_t - 1``): :func:`_aligned_values` of batch size 1.

    Raises:
        LocosError: the cache holds neither layout (an unsupported cache class).
    """
    return _aligned_values(before, after, n_row, layer)[0]  # [n_kv, n_row, d_head]


def _aligned_values(before: Tensor | None, after: Tensor | None, n_row: int,
                    layer: int) -> Tensor:
    """Values ``[B, n_kv, n_row, d_head]`` of the ``n_row`` keys a decode step's query
    attended to on one layer, oldest first.

    ``before``/``after`` are the layer's cache values just before and after the step.
    A full-attention layer's cache holds every key after the update. A sliding-window
    layer (transformers ``DynamicSlidingWindowLayer``) keeps only the last ``window - 1``
    keys, so after the update it no longer holds the oldest key the step attended to:
    those keys are the cache before the update plus the step's new value. Both are
    checked against the attention row's length, so a value can never be paired with the
    attention weight of another position.

    Raises:
        LocosError: the cache holds neither layout (an unsupported cache class).
    """
    if after is not None and after.shape[-2] == n_row:
        return after
    if after is not None and before is not None and before.shape[-2] + 1 == n_row:
        return torch.cat([before, after[:, :, -1:]], dim=-2)
    raise LocosError(
        f"layer {layer}: the attention row covers {n_row} keys but the KV cache holds "
        f"{None if after is None else after.shape[-2]} after the step "
        f"({None if before is None else before.shape[-2]} before); values cannot be "
        "aligned to key positions for this cache class")


def _assemble(
    attn: Sequence[Tensor], cache: Any, before: Sequence[Tensor | None], n_keys: int
) -> tuple[Tensor, list[Tensor]]:
    """One step's ``[n_layers, n_heads, n_keys]`` float32 pattern at absolute key
    positions (zeros before a sliding window), and per layer the ``[n_kv, K_l, d_head]``
    values of the ``K_l`` keys its row covers (views of the cache; a sliding layer's are
    its pre-step cache plus the step's new value).

    Raises:
        LocosError: a row longer than the keys, or a cache whose values cannot be aligned.
    """
    kv = []
    for l, row in enumerate(attn):
        if row.shape[-1] > n_keys:
            raise LocosError(f"layer {l}: attention row of {row.shape[-1]} keys for "
                             f"{n_keys} key positions")
        after = _cache_values(cache, l)
        if after is None:
            raise LocosError(f"layer {l}: the KV cache holds no values after the step")
        kv.append(_step_values(before[l], after, row.shape[-1], l))
    if all(r.shape[-1] == n_keys for r in attn):
        pattern = torch.stack(list(attn))
        if pattern.dtype != torch.float32:
            pattern = pattern.to(torch.float32)
    else:
        pattern = attn[0].new_zeros(len(attn), attn[0].shape[0], n_keys, dtype=torch.float32)
        for l, row in enumerate(attn):
            pattern[l, :, n_keys - row.shape[-1] :] = row
    return pattern, kv


def _stop_ids(model: Any) -> set[int]:
    ids: set[int] = set()
    tok = model.tokenizer
    gen_cfg = getattr(_hf_model(model), "generation_config", None)
    for src in (getattr(tok, "eos_token_id", None), getattr(gen_cfg, "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, Sequence):
            ids.update(int(i) for i in src)
    return ids



def _prompt_ids(tokens: Any) -> Tensor:
    """``tokens`` (ids, or an integer tensor of shape ``[N]`` or ``[1, N]``) as ``[1, N]``
    long.

    Raises:
        TrialError: a string (not tokenized), a float or bool tensor, or anything that is
            not a sequence of integer ids (:func:`locos_tl.trials.as_token_ids`)."""
    if isinstance(tokens, Tensor):
        dt = tokens.dtype
        if dt.is_floating_point or dt.is_complex or dt == torch.bool:
            raise TrialError(f"tokens must be integer token ids, got a {dt} tensor")
        return tokens.to(torch.long).reshape(1, -1)
    from locos_tl.trials import as_token_ids

    return torch.tensor([as_token_ids(tokens, "tokens")], dtype=torch.long).reshape(1, -1)


@torch.no_grad()
def greedy_decode(
    model: Any,
    tokens: Any,  # Sequence[int] | Tensor; checked by _prompt_ids (clear TrialError)
    *,
    max_new_tokens: int = 50,
    on_step: Callable[[DecodeStep], None] | None = None,
    directions: AnswerDirections | None = None,
    stop_at_newline: bool = True,
    stop_at_eos: bool = True,
    prefill_mode: str = "auto",
    chunk_size: int | None = None,
    forced_tokens: Sequence[int] | None = None,
    stop_rule: StopRule = "newline_token",
    thinking: bool = True,
    prompt_window: int = 0,
    on_prompt_rows: Callable[[int, Tensor], None] | None = None,
    decode_engine: DecodeEngine = "auto",
) -> DecodeResult:
    """Free greedy decoding, calling ``on_step`` at every step.

    Args:
        model: a TransformerBridge (batch size 1).
        tokens: prompt ids, length ``N >= 1``.
        max_new_tokens: at most this many generated tokens.
        on_step: called with a :class:`DecodeStep` (pattern rows, values, ``y_t``) per step.
        directions: answer directions for ``DecodeStep.phi``; needed only by phi users.
        stop_at_newline: stop at a newline (as ``stop_rule`` defines it); off for
            multi-line answers.
        stop_at_eos: stop after an end-of-sequence token.
        prefill_mode, chunk_size: see :func:`prefill`.
        forced_tokens: teacher forcing: step ``t`` takes ``forced_tokens[t]`` instead of
            the argmax (decoding ends when they run out).
        stop_rule: ``"newline_token"`` (default, the authors' release: only the bare
            newline token stops) or ``"contains_newline"`` (any token containing a
            newline); see :func:`is_newline_stop`.
        thinking: skip a ``<think> ... </think>`` block (Qwen3 style, tokens found by
            text, :func:`locos_tl.answers.think_token_ids`; a block left open by the
            prompt counts): newlines inside it and whitespace-only tokens right after
            it never stop, and its text is kept out of the response (docs/concepts.md,
            authors' release). ``False``: thinking tokens are ordinary tokens.
        prompt_window: with ``on_prompt_rows``, read the attention rows of the last
            ``prompt_window`` prompt positions (the HeadKV anchor variant): see
            :func:`prefill_with_rows`. The row of the last prompt position is step 0's
            ``DecodeStep.pattern``.
        on_prompt_rows: called once per layer with that layer's rows of the positions
            ``N - prompt_window .. N - 2``, ``[n_heads, rows, N - 1]``.
        decode_engine: ``"auto"`` (default: the eager twin, or with no ``on_step`` the
            SDPA twin, when it runs every attached hook; else the bridge, see
            :func:`step_engine`), ``"twin"`` or ``"bridge"`` (the TransformerBridge with
            ``hook_pattern`` hooks: the reference).

    Returns:
        The generated ids (the stop token included), the decoded response text (stop
        token and thinking excluded, stripped), and where the response starts.

    Raises:
        ValueError: unknown ``stop_rule`` or ``decode_engine``; ``"twin"`` impossible.
        ValueError: ``max_new_tokens`` is not an integer >= 1.
        TrialError: ``tokens`` is not a sequence or tensor of integer ids (a string, a
            float: the message says which); empty prompt; prompt + ``max_new_tokens``
            longer than ``n_ctx``.
        NonFiniteError: a step's logits hold NaN or inf (a :class:`TrialError`).
    """
    check_stop_rule(stop_rule)
    ids = _prompt_ids(tokens)
    if (isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int)
            or max_new_tokens < 1):
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    N = ids.shape[1]
    if N == 0:
        raise TrialError("empty prompt")
    n_ctx = getattr(model.cfg, "n_ctx", None)
    if n_ctx and N + max_new_tokens - 1 > n_ctx:  # the last new token is never fed
        raise TrialError(
            f"prompt of {N} tokens + {max_new_tokens} new tokens exceeds the model's "
            f"context n_ctx={n_ctx}"
        )
    device = next(_hf_model(model).parameters()).device
    ids = ids.to(device)
    n_layers = int(model.cfg.n_layers)
    W_O = [model.blocks[l].attn.W_O.detach() for l in range(n_layers)]  # views, no copy
    scale_hooks = directions.hook_names() if directions is not None else []
    eng = step_engine(model, decode_engine, rows=on_step is not None)

    cache = prefill_with_rows(model, ids[:, :-1], min(max(prompt_window - 1, 0), N - 1)
                              if on_prompt_rows is not None else 0, on_prompt_rows,
                              mode=prefill_mode, chunk_size=chunk_size)
    rows: dict[int, Tensor] = {}
    scales: dict[str, Tensor] = {}

    def keep_row(pattern: Tensor, hook: Any) -> None:
        rows[int(hook.name.split(".")[1])] = pattern[0, :, -1, :].detach()

    def keep_scale(scale: Tensor, hook: Any) -> None:  # stays on the device
        scales[hook.name] = scale.reshape(scale.shape[0], scale.shape[1], -1)[0, -1, 0]

    fwd_hooks = [(f"blocks.{l}.attn.hook_pattern", keep_row) for l in range(n_layers)]
    fwd_hooks += [(name, keep_scale) for name in scale_hooks]
    rules = _StopRules.of(model, stop_rule, thinking, stop_at_eos=stop_at_eos,
                          stop_at_newline=stop_at_newline)
    state = rules.initial(ids[0])  # does the prompt leave a thinking block open?

    if forced_tokens is not None:
        max_new_tokens = min(max_new_tokens, len(forced_tokens))
    keys = ids.new_zeros(N + max_new_tokens)  # key ids; step t reads keys[:N + t]
    keys[:N] = ids[0]
    sliding = _sliding_layers(cache, n_layers)
    generated: list[int] = []
    twin_scales = (_TwinScales(model, eng.twin, scale_hooks)
                   if eng.path == "eager_twin" else None)
    try:
        for t in range(max_new_tokens):
            n_keys = N + t
            step_input = keys[n_keys - 1 : n_keys].view(1, 1)
            # only a sliding layer's pre-step values are needed (and small); a full
            # layer's old cache is never kept alive past its update
            before = _pre_step_values(cache, sliding)
            attn: Sequence[Tensor] = ()
            if eng.path == "eager_twin":
                out = eng.twin(step_input, past_key_values=cache, use_cache=True,
                               output_attentions=True, logits_to_keep=1)
                logits = out.logits[0, -1]
                attn = [a.reshape(a.shape[1], a.shape[-1]) for a in out.attentions]
                step_scales = ({k: v[0] for k, v in twin_scales.values.items()}
                               if twin_scales is not None else {})
            elif eng.path == "sdpa_twin":
                logits = eng.twin(step_input, past_key_values=cache, use_cache=True,
                                  logits_to_keep=1).logits[0, -1]
                step_scales = {}
            else:
                rows.clear()
                scales.clear()
                logits = model.run_with_hooks(
                    step_input, fwd_hooks=fwd_hooks if on_step is not None else [],
                    past_key_values=cache, use_cache=True, return_type="logits",
                )[0, -1]
                attn = [rows[l] for l in range(n_layers)] if on_step is not None else ()
                step_scales = dict(scales)
            # the step's one host read: the token id, -1 when the logits hold NaN/inf
            pick = int(torch.where(torch.isfinite(logits).all(), logits.argmax(), -1))
            if pick < 0:  # e.g. fp16 overflow: argmax would be 0
                raise NonFiniteError(f"decoding step {t}: the logits hold NaN or inf "
                                     f"(dtype {logits.dtype}; an fp16 overflow? try bfloat16)")
            y = pick if forced_tokens is None else int(forced_tokens[t])
            step_thinking = rules.is_thinking(state, y)
            if on_step is not None:
                pattern, kv = _assemble(attn, cache, before, n_keys)
                on_step(DecodeStep(t=t, token=y, key_tokens=keys[:n_keys], pattern=pattern,
                                   values=_PaddedValues(kv, n_keys), scales=step_scales,
                                   logits=logits, thinking=step_thinking, _W_O=W_O,
                                   _directions=directions, _kv=kv))
            generated.append(y)
            if n_keys < keys.shape[0]:
                keys[n_keys] = y
            if rules.advance(state, t, y, step_thinking):
                break
    finally:
        if twin_scales is not None:
            twin_scales.remove()
    return rules.result(state, N, generated)
