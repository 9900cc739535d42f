"""The KV cache and the engines that fill it: prefill, and the decode-step engine.

The prompt is prefilled once (:func:`prefill`): by the fast SDPA twin of the HF model
sharing the bridge's weight tensors (:mod:`locos_tl.engine.twin`), or by the bridge itself in
query chunks. Each decode step of :func:`locos_tl.engine.decode.greedy_decode` then runs on
the engine :func:`step_engine` picks (``decode_engine``): the *eager twin* (called with
``output_attentions=True``: a query of length 1 costs one ``[n_heads, N]`` row per
layer; norm scales from light module pre-hooks, :class:`TwinScales`), the SDPA twin
when no attention rows are needed, or the TransformerBridge with ``hook_pattern`` hooks
-- the reference every fast path is tested against (``tests/test_fast_decode.py``),
used whenever a hook is attached to the bridge or no twin exists.

Values are read from the KV cache (they equal ``hook_v``) and aligned to absolute key
positions (:func:`aligned_values`): a sliding-window layer's cache drops the oldest
key during the step's update, so its values are the cache before the update plus the
step's new value (docs/concepts.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from locos_tl.engine.interventions import engine as intervention_engine
from locos_tl.engine.interventions import hooks_reproducible, lens_hooks_attached
from locos_tl.engine.options import DECODE_ENGINES, DecodeEngine
from locos_tl.engine.twin import sdpa_twin, twin_info
from locos_tl.errors import LocosError, warn_caller

__all__ = ["DECODE_ENGINES", "DecodeEngine", "StepEngine", "TwinScales", "aligned_values",
           "cache_values", "engine_paths", "fork_cache", "hf_model", "new_cache",
           "pre_step_values", "prefill", "prefill_with_rows", "sliding_layers", "step_engine",
           "step_values"]

log = logging.getLogger(__name__)



def hf_model(model: Any) -> Any:
    """The Hugging Face model a TransformerBridge wraps (``model.original_model``)."""
    return model.original_model


def new_cache(model: Any) -> Any:
    """An empty transformers ``DynamicCache`` for ``model``'s config (full and sliding
    layers as the config declares)."""
    from transformers import DynamicCache

    return DynamicCache(config=hf_model(model).config)


_new_cache = new_cache  # the old private name, still imported by experiments/{atp,patching}


def fork_cache(model: Any, cache: Any) -> Any:
    """A new KV cache holding ``cache``'s state with no tensor copied: each layer is a
    shallow copy. Safe because transformers' dynamic layers grow by concatenation and
    a sliding layer trims by slicing, never writing in place: a forward on the fork
    leaves ``cache`` as it was."""
    import copy

    fork = new_cache(model)
    fork.layers = [copy.copy(layer) for layer in cache.layers]
    return fork


@torch.no_grad()
def prefill(
    model: Any, tokens: Tensor, *, mode: str = "auto", chunk_size: int | None = None
) -> Any:
    """Fill a fresh KV cache with ``tokens`` (``[1, P]``); returns the cache.

    Args:
        mode: ``"sdpa"`` (twin model, fastest), ``"bridge"`` (the bridge's own eager
            forward), or ``"auto"`` (twin when available and every attached hook is a
            registered intervention it reproduces, :mod:`locos_tl.engine.interventions`).
        chunk_size: queries per forward. Default: the whole prompt for the SDPA twin
            (its causal kernel never forms an ``N x N`` tensor, so memory is linear and
            one call is fastest) and 1024 for the bridge, whose eager attention forms
            ``[n_heads, chunk, N]`` scores.

    Raises:
        ValueError: unknown mode.
    """
    if mode not in ("auto", "sdpa", "bridge"):
        raise ValueError(f"unknown prefill mode {mode!r}; use 'auto', 'sdpa' or 'bridge'")
    cache = new_cache(model)
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
    """Choose the engine of :func:`locos_tl.engine.decode.greedy_decode`'s steps.

    ``"auto"``: with ``rows`` (a step callback needs attention rows), the eager twin
    when no hook of any kind is attached to the bridge (its hooks would not fire on the
    twin); without rows, the SDPA twin when it reproduces every attached hook
    (:func:`locos_tl.engine.interventions.engine`). Otherwise the bridge, with a
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
        warn_caller(f"decode steps run through the TransformerBridge (slower, same values):"
                    f" {reason}", RuntimeWarning)
    return StepEngine("bridge", None, reason)


def engine_paths(
    model: Any, prefill_mode: str = "auto", decode_engine: str = "auto", *, rows: bool = True
) -> dict[str, Any]:
    """Which prefill and decode-step paths :func:`locos_tl.engine.decode.greedy_decode` takes on
    ``model`` now, with the fallback reasons (recorded in ``meta.json`` and
    ``HeadScores.meta``).

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


class TwinScales:
    """Light forward pre-hooks on the twin's norms: ``hook_scale`` at the last position.

    The same value TransformerLens' norm bridge gives ``hook_scale`` (float32
    ``sqrt(mean(x^2) + eps)``, ``x`` centred first for a LayerNorm), one per batch row
    (``[B]`` device tensor; :func:`locos_tl.engine.decode.greedy_decode` and
    :mod:`locos_tl.runs.batch` share it); names are the TransformerLens hook names
    (``ln_final.hook_scale``, ``blocks.{l}.ln1_post.hook_scale``).

    Raises:
        LocosError: a norm with no counterpart in the twin.
    """

    def __init__(self, model: Any, twin: Any, names: Sequence[str]) -> None:
        self.values: dict[str, Tensor] = {}
        self.handles: list[Any] = []
        if not names:
            return
        hf = hf_model(model)
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


def cache_values(cache: Any, layer: int) -> Tensor | None:
    """The layer's cached values ``[B, n_kv, K, d_head]`` (None before the first update)."""
    vals = getattr(cache.layers[layer], "values", None) if layer < len(cache.layers) else None
    return vals if isinstance(vals, Tensor) else None


def sliding_layers(cache: Any, n_layers: int) -> list[bool]:
    """Per layer, whether its cache is a sliding-window layer (``is_sliding``), the
    layers whose pre-step values :func:`step_values` needs; a full layer's old values
    are never kept alive past its update."""
    return [bool(getattr(cache.layers[l], "is_sliding", False))
            if l < len(cache.layers) else False for l in range(n_layers)]


def pre_step_values(cache: Any, sliding: Sequence[bool]) -> list[Tensor | None]:
    """The ``before`` of :func:`step_values` for every layer: a sliding layer's cache
    values just before the step (small), None for a full layer."""
    return [cache_values(cache, l) if s else None for l, s in enumerate(sliding)]


def step_values(before: Tensor | None, after: Tensor, n_row: int, layer: int) -> Tensor:
    """Values of the ``n_row`` keys one decode step's query attended to, ``[n_kv, n_row,
    d_head]`` (a view of the cache when it holds them all), oldest first (absolute
    positions ``N_t - n_row .. N_t - 1``): :func:`aligned_values` of batch size 1.

    Raises:
        LocosError: the cache holds neither layout (an unsupported cache class).
    """
    return aligned_values(before, after, n_row, layer)[0]  # [n_kv, n_row, d_head]


def aligned_values(before: Tensor | None, after: Tensor | None, n_row: int,
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
