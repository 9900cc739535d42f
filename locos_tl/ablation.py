"""Head ablation: replace a head's query or output by its calibration mean (or zero).

The paper's ablation (Gema, Alex & Minervini 2026, arXiv 2607.01002, Sec. 4; docs/concepts.md
Sec. 4) replaces a head's **query** -- ``blocks.{l}.attn.hook_q``, the output of
``q_proj``, before QK-norm and rotary in TransformerLens 4.3's bridge -- by its mean over
the token positions of calibration text (mean per prompt, then mean of those means).
A zero query gives zero attention scores, hence uniform attention over the visible
prefix. Output ablation acts on ``hook_z`` (the head's attention-weighted values, before
``W_O``). Both hooks are per *query* head (``[batch, pos, n_heads, d_head]``), so
grouped-query attention needs no special care: ablating head ``h`` leaves the shared
key/value head -- and the other query heads reading it -- untouched.

Hooks live only inside :func:`ablate` (a context manager); they are removed on exit and
on exceptions, and hooks attached by anyone else are left alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from locos_tl.decode import prefill
from locos_tl.heads import Head

AblationMode = Literal["query_mean", "query_zero", "output_mean", "output_zero"]
ABLATION_MODES: tuple[str, ...] = get_args(AblationMode)

_HOOK = {"query": "blocks.{l}.attn.hook_q", "output": "blocks.{l}.attn.hook_z"}


@dataclass
class AblationMeans:
    """Calibration means of every head's query (``hook_q``) and output (``hook_z``).

    Attributes:
        q: ``[n_layers, n_heads, d_head]`` mean query before QK-norm and rotary.
        z: ``[n_layers, n_heads, d_head]`` mean head output before ``W_O``.
        n_prompts: calibration prompts used.
        n_tokens: token positions seen over all prompts.
        meta: provenance (model name, ``max_tokens``).
    """

    q: Float[Tensor, "n_layers n_heads d_head"]
    z: Float[Tensor, "n_layers n_heads d_head"]
    n_prompts: int = 0
    n_tokens: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def for_mode(self, mode: str) -> Float[Tensor, "n_layers n_heads d_head"]:
        """The means a ``*_mean`` mode substitutes (``q`` or ``z``)."""
        return self.q if mode.startswith("query") else self.z

    def save(self, path: str | Path) -> Path:
        """Write a ``.safetensors`` file (tensors ``q``, ``z``; counts and meta as metadata)."""
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        info = {"n_prompts": self.n_prompts, "n_tokens": self.n_tokens, "meta": self.meta}
        save_file({"q": self.q.contiguous(), "z": self.z.contiguous()}, str(path),
                  metadata={"locos_tl": json.dumps(info, default=str)})
        return path

    @classmethod
    def load(cls, path: str | Path) -> AblationMeans:
        """Read what :meth:`save` wrote.

        Raises:
            FileNotFoundError: no such file.
        """
        from safetensors import safe_open

        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no calibration means at {path}")
        with safe_open(str(path), framework="pt") as f:
            info = json.loads((f.metadata() or {}).get("locos_tl", "{}"))
            q, z = f.get_tensor("q"), f.get_tensor("z")
        return cls(q=q, z=z, n_prompts=int(info.get("n_prompts", 0)),
                   n_tokens=int(info.get("n_tokens", 0)), meta=dict(info.get("meta", {})))


@torch.no_grad()
def calibrate_means(
    model: Any,
    prompts: Sequence[str | Sequence[int]],
    *,
    max_tokens: int = 5000,
    chunk_size: int = 1024,
    progress: bool = False,
) -> AblationMeans:
    """Mean query and output of every head over calibration text (docs/concepts.md).

    The paper uses 50 raw-text prompts of at most 5000 tokens: for each prompt the mean
    over its token positions, then the mean of those per-prompt means (so every prompt
    weighs the same). The prompt runs through the bridge in query chunks of
    ``chunk_size`` with a KV cache, so memory stays ``O(chunk_size x N)``.

    Args:
        model: a TransformerBridge.
        prompts: raw strings (tokenized with ``model.tokenizer``) or token-id lists.
        max_tokens: each prompt is cut to its first ``max_tokens`` tokens.
        chunk_size: query positions per bridge forward.
        progress: show a tqdm bar.

    Returns:
        :class:`AblationMeans` in float32 on CPU.

    Raises:
        ValueError: no prompt, or a prompt with no token.
    """
    from locos_tl.models import model_name

    if not prompts:
        raise ValueError("calibrate_means needs at least one prompt")
    L, H, d = int(model.cfg.n_layers), int(model.cfg.n_heads), int(model.cfg.d_head)
    device = next(model.original_model.parameters()).device
    sums = {kind: torch.zeros(L, H, d, dtype=torch.float64, device=device)
            for kind in ("query", "output")}
    means = {kind: torch.zeros(L, H, d, dtype=torch.float64) for kind in sums}

    def accumulate(kind: str) -> Any:
        def hook(x: Tensor, hook: Any) -> None:
            sums[kind][int(hook.name.split(".")[1])] += x[0].to(torch.float64).sum(0)
        return hook

    hooks = [(_HOOK[kind].format(l=l), accumulate(kind)) for kind in sums for l in range(L)]
    n_tokens = 0
    for p in tqdm(prompts, desc="calibrating", unit="prompt", disable=not progress):
        ids = model.tokenizer.encode(p) if isinstance(p, str) else list(p)
        ids = ids[:max_tokens]
        if not ids:
            raise ValueError("a calibration prompt has no token")
        for s in sums.values():
            s.zero_()
        with model.hooks(fwd_hooks=hooks):
            prefill(model, torch.tensor([ids], device=device), mode="bridge",
                    chunk_size=chunk_size)
        for kind in sums:
            means[kind] += sums[kind].cpu() / len(ids)
        n_tokens += len(ids)
    n = len(prompts)
    return AblationMeans(
        q=(means["query"] / n).to(torch.float32), z=(means["output"] / n).to(torch.float32),
        n_prompts=n, n_tokens=n_tokens,
        meta={"model": model_name(model), "max_tokens": max_tokens},
    )


def check_mode(mode: str) -> AblationMode:
    """Validate an ablation mode name.

    Raises:
        ValueError: unknown mode; the message lists the known ones.
    """
    if mode not in ABLATION_MODES:
        raise ValueError(f"unknown ablation mode {mode!r}; use one of {list(ABLATION_MODES)}")
    return mode  # type: ignore[return-value]


def check_heads(model: Any, heads: Sequence[Head]) -> list[Head]:
    """``heads`` as ``(layer, head)`` int pairs.

    Raises:
        ValueError: a head outside the model's layers x heads.
    """
    L, H = int(model.cfg.n_layers), int(model.cfg.n_heads)
    out = []
    for lh in heads:
        l, h = (int(x) for x in lh)
        if not (0 <= l < L and 0 <= h < H):
            raise ValueError(f"head ({l}, {h}) is outside the model's {L} layers x {H} heads")
        out.append((l, h))
    return out


def ablation_hooks(
    model: Any,
    heads: Sequence[Head],
    mode: AblationMode = "query_mean",
    means: AblationMeans | None = None,
) -> list[tuple[str, Any]]:
    """``(hook_name, hook_fn)`` pairs implementing the ablation (one hook per layer).

    Raises:
        ValueError: unknown mode, a head outside the model, or a ``*_mean`` mode without
            ``means`` (or with means of another shape).
    """
    mode = check_mode(mode)
    heads = check_heads(model, heads)
    kind, fill = mode.split("_")
    L, H, d = int(model.cfg.n_layers), int(model.cfg.n_heads), int(model.cfg.d_head)
    table = None
    if fill == "mean":
        if means is None:
            raise ValueError(f"mode {mode!r} needs calibration means (see calibrate_means)")
        table = means.for_mode(mode)
        if tuple(table.shape) != (L, H, d):
            raise ValueError(f"calibration means have shape {tuple(table.shape)}, the model "
                             f"needs {(L, H, d)} (means of another model?)")
    by_layer: dict[int, list[int]] = {}
    for l, h in heads:
        by_layer.setdefault(l, [])
        if h not in by_layer[l]:
            by_layer[l].append(h)

    def make(layer: int, idx: list[int]) -> Any:
        index = torch.tensor(idx)
        value = None if table is None else table[layer, index]  # [k, d_head]

        def hook(x: Tensor, hook: Any) -> Tensor:  # x: [batch, pos, n_heads, d_head]
            if x.ndim != 4 or x.shape[2] != H:
                raise RuntimeError(f"{hook.name} has shape {tuple(x.shape)}; expected "
                                   f"[batch, pos, {H}, {d}] (unsupported attention layout)")
            x = x.clone()
            i = index.to(x.device)
            x[:, :, i] = 0.0 if value is None else value.to(device=x.device, dtype=x.dtype)
            return x

        return hook

    return [(_HOOK[kind].format(l=l), make(l, idx)) for l, idx in sorted(by_layer.items())]


@contextmanager
def ablate(
    model: Any,
    heads: Sequence[Head],
    mode: AblationMode = "query_mean",
    *,
    means: AblationMeans | None = None,
) -> Iterator[Any]:
    """Ablate attention heads for every forward pass run inside the block.

    Modes (docs/concepts.md):
        - ``query_mean`` (paper): the head's query at ``hook_q`` (before QK-norm and
          rotary) is replaced by its calibration mean at every position.
        - ``query_zero``: the query is set to 0, so every attention score is 0 and the
          head attends uniformly over the visible prefix.
        - ``output_mean`` / ``output_zero``: the head's output ``hook_z`` (before
          ``W_O``) is replaced by its calibration mean / by 0 (removes its write).

    Generation inside the block must run every position through the bridge
    (``greedy_decode(..., prefill_mode="bridge")``): the fast SDPA prefill twin does
    not fire TransformerLens hooks.

    Args:
        model: a TransformerBridge.
        heads: ``(layer, head)`` pairs (query-head indices); empty means no ablation.
        mode: one of :data:`ABLATION_MODES`.
        means: calibration means, needed by the ``*_mean`` modes.

    Yields:
        The model.

    Raises:
        ValueError: see :func:`ablation_hooks` (raised before any hook is attached).

    Example:
        >>> with ablate(model, [(14, 3), (20, 1)], "query_zero"):  # doctest: +SKIP
        ...     logits = model(tokens)
    """
    hooks = ablation_hooks(model, heads, mode, means)
    with model.hooks(fwd_hooks=hooks):  # removes exactly these hooks on exit / exception
        yield model


def random_heads(
    n_layers: int, n_heads: int, k: int, seed: int, *, exclude: Sequence[Head] = ()
) -> list[Head]:
    """``k`` distinct heads drawn uniformly at random (the random-heads control).

    The draw is a seeded permutation of all heads, so for one seed the sets are nested
    (the first 5 heads of ``k=10`` are the ``k=5`` set).

    Args:
        n_layers, n_heads: the model's geometry.
        k: how many heads.
        seed: numpy ``default_rng`` seed.
        exclude: heads never drawn (e.g. a method's top-k).

    Raises:
        ValueError: ``k`` is negative or larger than the heads available.
    """
    excluded = {(int(l), int(h)) for l, h in exclude}
    available = n_layers * n_heads - len(excluded)
    if not 0 <= k <= available:
        raise ValueError(f"cannot draw {k} heads from {available} available")
    perm = np.random.default_rng(seed).permutation(n_layers * n_heads)
    out: list[Head] = []
    for i in perm:
        lh = divmod(int(i), n_heads)
        if lh not in excluded:
            out.append(lh)
            if len(out) == k:
                break
    return out
