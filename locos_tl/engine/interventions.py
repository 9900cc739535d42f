"""One registry of active interventions, run by the bridge or by the fast SDPA twin.

TransformerLens hook points define what an intervention *means* (docs/architecture.md,
"Engines behind one semantics"): ablation substitutes at ``blocks.{l}.attn.hook_q`` (the
``q_proj`` output, before QK-norm and rotary) or, on a shared query norm, after the norm
at ``hook_q_normed``; output ablation and activation patching write ``hook_z`` (the
input of ``W_O``). :func:`intervene` attaches such hooks to the bridge -- the reference
-- and the *same hook functions*, wrapped as plain torch module hooks, to the SDPA twin
(:mod:`locos_tl.engine.twin`), whose modules compute exactly those tensors:

- ``attn.hook_q`` (= ``attn.q.hook_out``): a forward hook on ``q_proj`` (of
  ``model.layers.{l}.self_attn``), its output ``[b, pos, H * d_head]`` viewed as
  ``[b, pos, H, d_head]``;
- ``attn.hook_z`` (= ``attn.o.hook_in``): a forward pre-hook on ``o_proj``, its input
  (z flattened over heads) viewed the same way;
- ``attn.q_norm.hook_in`` / ``attn.hook_q_normed``: a forward pre-hook / forward hook
  on ``q_norm``, its input / output as is.

The ``q_norm`` pair holds only for a *shared* query norm (OLMo-2/3: one RMSNorm over
``H * d_head``), where TransformerLens and HF see the same ``[b, pos, H * d_head]``
tensor; on a per-head norm TransformerLens sees another layout, so such a hook has no
twin equivalent. Any other hook point also has none.

:func:`engine` says which engine reproduces everything attached to a model: ``"twin"``
when the twin exists and every TransformerLens hook attached to the bridge belongs to an
active :func:`intervene` block with a twin equivalent; otherwise ``"bridge"``. Hooks a
user attaches directly (``model.hooks``, ``run_with_hooks``, ``add_hook``) therefore
always route through the bridge, where they fire. (Plain torch hooks on bridge modules
are not detected: the bridge and transformers install their own there.) The equality
of both engines (logits, greedy tokens and patched metrics, float32, 1e-5, on Qwen3,
Gemma-3 with a sliding window shorter than the prompt, OLMo-2 and Llama) is tested
in ``tests/test_fast_interventions.py``.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from locos_tl.engine.twin import sdpa_twin
from locos_tl.errors import warn_caller

Engine = Literal["twin", "bridge"]
HookFn = Callable[..., Tensor | None]

# TransformerLens hook name -> (twin module under self_attn, "in" | "out", per-head view)
_SITES: tuple[tuple[re.Pattern[str], str, str, bool], ...] = (
    (re.compile(r"^blocks\.(\d+)\.attn\.(?:hook_q|q\.hook_out)$"), "q_proj", "out", True),
    (re.compile(r"^blocks\.(\d+)\.attn\.(?:hook_z|o\.hook_in)$"), "o_proj", "in", True),
    (re.compile(r"^blocks\.(\d+)\.attn\.q_norm\.hook_in$"), "q_norm", "in", False),
    (re.compile(r"^blocks\.(\d+)\.attn\.hook_q_normed$"), "q_norm", "out", False),
)


@dataclass(eq=False)
class _Active:
    """One open :func:`intervene` block: its bridge handles and twin module handles."""

    hooks: list[tuple[str, HookFn]]
    twin_ok: bool
    lens_handles: set[int] = field(default_factory=set)


_ACTIVE: weakref.WeakKeyDictionary[Any, list[_Active]] = weakref.WeakKeyDictionary()
_WARNED: weakref.WeakSet[Any] = weakref.WeakSet()


class _HookName:
    """Stands in for the ``HookPoint`` a TransformerLens hook receives (only ``.name``)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


_ATTN: weakref.WeakKeyDictionary[Any, dict[int, torch.nn.Module]] = weakref.WeakKeyDictionary()


def _attn_modules(twin: Any) -> dict[int, torch.nn.Module]:
    """Layer -> the twin's ``self_attn`` module (found once per twin)."""
    if twin not in _ATTN:
        out: dict[int, torch.nn.Module] = {}
        for name, mod in twin.named_modules():
            m = re.search(r"(?:^|\.)layers\.(\d+)\.self_attn$", name)
            if m:
                out[int(m.group(1))] = mod
        _ATTN[twin] = out
    return _ATTN[twin]


def is_shared_q_norm(norm: Any, n_heads: int, d_head: int) -> bool:
    """Whether a ``q_norm`` module normalises all heads' concatenated queries together
    (OLMo-2/3: weight ``[n_heads * d_head]``) rather than each head on its own (Qwen3,
    Gemma-3: weight ``[d_head]``)."""
    w = getattr(norm, "weight", None)
    return isinstance(w, Tensor) and tuple(w.shape) == (n_heads * d_head,) and n_heads > 1


def _twin_hook(name: str, fn: HookFn, module: torch.nn.Module, where: str,
               per_head: bool, H: int, d: int) -> tuple[str, Callable]:
    hp = _HookName(name)

    def as_heads(x: Tensor) -> Tensor:
        return x.reshape(*x.shape[:-1], H, d) if per_head else x

    if where == "out":
        def fwd(_mod: Any, _args: Any, out: Tensor) -> Tensor | None:
            res = fn(as_heads(out), hook=hp)
            return None if res is None else res.reshape(out.shape)

        return "forward", fwd

    def pre(_mod: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        x = args[0]
        res = fn(as_heads(x), hook=hp)
        return None if res is None else (res.reshape(x.shape), *args[1:])

    return "pre", pre


def twin_hooks(
    model: Any, twin: Any, hooks: Sequence[tuple[str, HookFn]]
) -> list[tuple[torch.nn.Module, str, Callable]] | None:
    """The twin module hooks equivalent to TransformerLens ``hooks`` (table above).

    Args:
        model: a TransformerBridge (for ``n_heads``, ``d_head``).
        twin: its SDPA twin.
        hooks: ``(hook_name, fn)`` pairs, ``fn(activation, hook=...)`` as for
            ``model.hooks``; string names only.

    Returns:
        ``(module, "forward" | "pre", torch_hook)`` triples in the order of ``hooks``, or
        None when any hook has no twin equivalent (an unmapped hook point, a name filter,
        a per-head ``q_norm``, a fused or differently shaped projection).
    """
    H, d = int(model.cfg.n_heads), int(model.cfg.d_head)
    layers = _attn_modules(twin)
    out = []
    for name, fn in hooks:
        if not isinstance(name, str):
            return None
        site = next(((m, s) for s in _SITES if (m := s[0].match(name))), None)
        if site is None:
            return None
        match, (_, sub, where, per_head) = site
        attn = layers.get(int(match.group(1)))
        module = getattr(attn, sub, None) if attn is not None else None
        if not isinstance(module, torch.nn.Module):
            return None
        if sub == "q_proj" and getattr(module, "out_features", None) != H * d:
            return None
        if sub == "o_proj" and getattr(module, "in_features", None) != H * d:
            return None
        if sub == "q_norm" and not is_shared_q_norm(module, H, d):  # OLMo's only
            return None
        kind, hook = _twin_hook(name, fn, module, where, per_head, H, d)
        out.append((module, kind, hook))
    return out


def _lens_handles(model: Any) -> Iterator[Any]:
    points = getattr(model, "hook_points", None)
    if not callable(points):
        return
    for hp in points():
        yield from getattr(hp, "fwd_hooks", ()) or ()
        yield from getattr(hp, "bwd_hooks", ()) or ()


def lens_hooks_attached(model: Any) -> bool:
    """Whether any TransformerLens hook (forward or backward) is attached to ``model``,
    by anyone (a user, or an open :func:`intervene` block)."""
    return any(True for _ in _lens_handles(model))


@contextmanager
def intervene(model: Any, fwd_hooks: Sequence[tuple[str, HookFn]]) -> Iterator[Engine]:
    """Attach interventions to the bridge and, where equivalent, to its SDPA twin.

    Inside the block every bridge forward runs ``fwd_hooks`` through TransformerLens (the
    reference) and every twin forward runs the same functions as module hooks (module
    docstring). Both sets are removed on exit and on exceptions; hooks attached by anyone
    else are left alone. Blocks nest.

    Args:
        model: a TransformerBridge.
        fwd_hooks: ``(hook_name, fn)`` pairs as for ``model.hooks``.

    Yields:
        :func:`engine` of the model inside the block.
    """
    hooks = list(fwd_hooks)
    if not hooks:  # nothing to attach (e.g. a clean or corrupted run of patching)
        yield engine(model)
        return
    twin = sdpa_twin(model)
    plan = twin_hooks(model, twin, hooks) if twin is not None else None
    if twin is not None and plan is None and model not in _WARNED:
        _WARNED.add(model)
        names = sorted({str(n) for n, _ in hooks})
        warn_caller(
            f"interventions at {names[:4]} have no module-hook equivalent on the fast SDPA "
            "twin; forwards inside them run through the TransformerBridge (slower, same "
            "values)", RuntimeWarning)
    entry = _Active(hooks=hooks, twin_ok=plan is not None)
    before = {id(h) for h in _lens_handles(model)}
    active = _ACTIVE.setdefault(model, [])
    torch_handles: list[Any] = []
    with model.hooks(fwd_hooks=hooks):  # removes exactly these TL hooks on exit / exception
        try:
            entry.lens_handles = {id(h) for h in _lens_handles(model)} - before
            for module, kind, fn in plan or ():
                torch_handles.append(module.register_forward_hook(fn) if kind == "forward"
                                     else module.register_forward_pre_hook(fn))
            active.append(entry)
            yield engine(model)
        finally:
            for handle in torch_handles:
                handle.remove()
            if entry in active:
                active.remove(entry)


def hooks_reproducible(model: Any) -> bool:
    """Whether the twin reproduces every hook attached to ``model``.

    True when each TransformerLens hook (forward or backward) attached to the bridge was
    attached by an open :func:`intervene` block whose hooks all have twin equivalents.
    Plain torch hooks on bridge modules are not seen (the bridge and transformers keep
    their own there); attach interventions as TransformerLens hooks. Says nothing about
    whether a twin exists (see :func:`engine`).
    """
    ok: set[int] = set()
    for entry in _ACTIVE.get(model, ()):
        if entry.twin_ok:
            ok |= entry.lens_handles
    return all(id(h) in ok for h in _lens_handles(model))


def engine(model: Any) -> Engine:
    """``"twin"`` when the SDPA twin exists and reproduces every attached hook
    (:func:`hooks_reproducible`), else ``"bridge"``."""
    return "twin" if hooks_reproducible(model) and sdpa_twin(model) is not None else "bridge"


_LAYER = re.compile(r"^blocks\.(\d+)\.")


def lowest_intervened_layer(model: Any) -> int | None:
    """The lowest layer any open :func:`intervene` block writes to (its hook names'
    ``blocks.{l}``), 0 when a hook sits outside the blocks (say ``hook_embed``), or None
    when no block is open. Every layer below it computes exactly what an unintervened
    forward computes: interventions act only forward."""
    layers = []
    for entry in _ACTIVE.get(model, ()):
        for name, _ in entry.hooks:
            m = _LAYER.match(name) if isinstance(name, str) else None
            layers.append(int(m.group(1)) if m else 0)
    return min(layers) if layers else None
