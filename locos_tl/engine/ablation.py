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

Invariant, every mode and architecture: ablating head ``(l, h)`` leaves every other
head's ``hook_z`` unchanged (the other heads of layer ``l`` and all heads of earlier
layers). A per-head QK-norm (Qwen3, Gemma-3) or none (Llama) keeps it with the
substitution at ``hook_q``. **Shared query norm (OLMo-2/3):** ``q_norm`` is one RMSNorm
over all heads' concatenated queries (``n_heads * d_head`` wide), so a head's query
substituted at ``hook_q`` changes the RMS and rescales every other head of the layer.
There the substitution runs after the norm instead: the layer's pre-norm query with the
ablated heads' slices replaced (by the mean or 0) is normalised by the checkpoint's own
``q_norm``, and only the ablated heads' slices of that result replace theirs at
``hook_q_normed``. The ablated heads get exactly the query the authors' hook gives them
(their ``q_proj``-output hook normalises the substituted query over the whole layer);
the other heads keep the query of the unablated run. The authors' hook, by contrast,
also perturbs the other heads of the layer on OLMo (docs/concepts.md, "Ablation on
OLMo"); on per-head norms the two are identical.

Hooks live only inside :func:`ablate` (a context manager); they are removed on exit and
on exceptions, and hooks attached by anyone else are left alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from locos_tl.engine.forward import prefill
from locos_tl.engine.interventions import intervene, is_shared_q_norm
from locos_tl.engine.options import (  # noqa: F401  (re-exported: their old home)
    ABLATION_MODES,
    AblationMode,
    check_mode,
)
from locos_tl.errors import TrialError
from locos_tl.head_spec import HeadLike, as_int, parse_heads
from locos_tl.heads import Head
from locos_tl.tokenize import BosPolicy

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
        from safetensors.torch import save

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        info = {"n_prompts": self.n_prompts, "n_tokens": self.n_tokens, "meta": self.meta}
        # written by Python, so the file gets the usual permissions (umask), like the
        # run's other files (safetensors' save_file may create it 0600)
        path.write_bytes(save({"q": self.q.contiguous(), "z": self.z.contiguous()},
                              metadata={"locos_tl": json.dumps(info, default=str)}))
        return path

    @classmethod
    def load(cls, path: str | Path) -> AblationMeans:
        """Read what :meth:`save` wrote.

        Raises:
            FileNotFoundError: no such file.
            DataFormatError: the file is no safetensors file, or lacks tensor ``q``/``z``.
        """
        from safetensors import SafetensorError, safe_open

        from locos_tl.errors import DataFormatError

        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no calibration means at {path}")
        try:
            with safe_open(str(path), framework="pt") as f:
                info = json.loads((f.metadata() or {}).get("locos_tl", "{}"))
                q, z = f.get_tensor("q"), f.get_tensor("z")
        except (SafetensorError, ValueError) as exc:
            raise DataFormatError(
                f"{path} is not a calibration means file (a .safetensors file with tensors "
                f"q and z, as `locos calibrate` / AblationMeans.save write): {exc}") from None
        return cls(q=q, z=z, n_prompts=int(info.get("n_prompts", 0)),
                   n_tokens=int(info.get("n_tokens", 0)), meta=dict(info.get("meta", {})))


@torch.no_grad()
def calibrate_means(
    model: Any,
    prompts: Any,  # Sequence[str | Sequence[int]]; checked by _check_prompts
    *,
    max_tokens: int = 5000,
    chunk_size: int = 1024,
    progress: bool = False,
    bos: BosPolicy = "none",
) -> AblationMeans:
    """Mean query and output of every head over calibration text (docs/concepts.md).

    The paper uses 50 raw-text prompts of at most 5000 tokens: for each prompt the mean
    over its token positions, then the mean of those per-prompt means (so every prompt
    weighs the same). The prompt runs in query chunks of ``chunk_size`` with a KV cache,
    so memory stays ``O(chunk_size x N)``: on the SDPA twin, the reading hooks run as
    module hooks (:mod:`locos_tl.engine.interventions`), or through the bridge when a hook the
    twin cannot run is attached.

    Args:
        model: a TransformerBridge.
        prompts: raw strings (tokenized by :func:`locos_tl.tokenize.encode_prompt`
            with the checkpoint's own tokenizer) or token-id lists (used as given).
        max_tokens: each prompt is cut to its first ``max_tokens`` tokens.
        chunk_size: query positions per bridge forward.
        progress: show a tqdm bar.
        bos: BOS policy for string prompts. Default ``"none"``: raw text with no BOS,
            as the authors' release calibrates (docs/concepts.md, release protocol;
            this is the one place locos_tl departs from its BOS rule, because the
            published protocol says so). ``"checkpoint"``: the checkpoint's rule that
            trials follow (BOS once at position 0 where its tokenizer adds one).

    Returns:
        :class:`AblationMeans` in float32 on CPU.

    Raises:
        ValueError: no prompt, a prompt with no token, or an unknown ``bos``.
        TrialError: (a ``ValueError``) ``prompts`` is one bare string or Trial (pass
            a list), or a prompt is neither a string nor a list of integer token ids
            (the message names its index).
        TrialError: a prompt (cut to ``max_tokens``) is longer than the model's
            ``n_ctx``; a string prompt holds the checkpoint's BOS after position 0.
    """
    from locos_tl.models.load import model_settings
    from locos_tl.tokenize import encode_prompt

    prompts = _check_prompts(prompts)
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
    n_ctx = getattr(model.cfg, "n_ctx", None)
    for i, p in enumerate(tqdm(prompts, desc="calibrating", unit="prompt",
                               disable=not progress)):
        ids = encode_prompt(model, p, bos=bos)[0] if isinstance(p, str) else list(p)
        ids = ids[:max_tokens]
        if not ids:
            raise ValueError("a calibration prompt has no token")
        if n_ctx and len(ids) > n_ctx:
            raise TrialError(
                f"calibration prompt {i} has {len(ids)} tokens (after max_tokens="
                f"{max_tokens}), longer than the model's context n_ctx={n_ctx}; pass "
                f"max_tokens={n_ctx} or shorter prompts"
            )
        for s in sums.values():
            s.zero_()
        with intervene(model, hooks):  # on the SDPA twin as module hooks when possible
            prefill(model, torch.tensor([ids], device=device), chunk_size=chunk_size)
        for kind in sums:
            means[kind] += sums[kind].cpu() / len(ids)
        n_tokens += len(ids)
    n = len(prompts)
    return AblationMeans(
        q=(means["query"] / n).to(torch.float32), z=(means["output"] / n).to(torch.float32),
        n_prompts=n, n_tokens=n_tokens,
        meta={**model_settings(model), "max_tokens": max_tokens, "bos": bos},
    )



def _check_prompts(prompts: Any) -> list[str | tuple[int, ...]]:
    """The calibration prompts as a list of strings and token-id tuples.

    Raises:
        TrialError: ``prompts`` is one string (it would run one prompt per character),
            one Trial, a mapping or not iterable; an item is neither a string nor a
            sequence of non-negative integer ids (the message names its index).
    """
    from locos_tl.trials import Trial, as_token_ids

    if isinstance(prompts, (str, bytes)):
        raise TrialError("calibrate_means() got one string: pass a list of prompts, e.g. "
                         "[text] (a bare string would run one prompt per character)")
    if isinstance(prompts, Trial):
        raise TrialError("calibrate_means() got one Trial: pass a list of prompts (raw "
                         "texts or token-id lists, e.g. [trial.tokens])")
    if isinstance(prompts, Mapping) or not isinstance(prompts, Iterable):
        raise TrialError(f"calibrate_means() needs a list of prompts (raw texts or "
                         f"token-id lists), got {type(prompts).__name__}")
    out: list[str | tuple[int, ...]] = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            out.append(p)
        elif isinstance(p, Trial):
            raise TrialError(f"calibration prompt {i} is a Trial: pass its tokens "
                             "(trial.tokens) or a raw text")
        elif isinstance(p, (bytes, Mapping)) or not isinstance(p, Iterable):
            raise TrialError(f"calibration prompt {i} is {type(p).__name__} {p!r}"[:120]
                             + ": each prompt is a raw text (str) or a list of token ids")
        else:
            out.append(as_token_ids(p, f"calibration prompt {i}"))
    return out


def shared_q_norm(model: Any, layer: int) -> torch.nn.Module | None:
    """The checkpoint's ``q_norm`` of ``layer`` when it normalises all heads together.

    OLMo-2/3 (and OLMoE) apply one RMSNorm over the concatenated queries of all heads
    (weight ``[n_heads * d_head]``) before splitting them into heads; Qwen3 and Gemma-3
    normalise each head on its own (weight ``[d_head]``), Llama has no QK-norm.

    Args:
        model: a TransformerBridge.
        layer: layer index.

    Returns:
        The HF norm module (called directly, so no bridge hook fires twice), or None for a
        per-head norm or no norm.
    """
    attn = model.blocks[layer].attn
    bridge_norm = getattr(attn, "q_norm", None)
    norm = getattr(bridge_norm, "original_component", None)
    if norm is None or not hasattr(attn, "hook_q_normed"):
        return None
    phase = getattr(attn, "_qk_norm_phase", None)
    if phase is not None:
        return norm if phase == "pre_reshape" else None
    shared = is_shared_q_norm(norm, int(model.cfg.n_heads), int(model.cfg.d_head))
    return norm if shared else None


def ablation_hooks(
    model: Any,
    heads: Sequence[HeadLike],
    mode: AblationMode = "query_mean",
    means: AblationMeans | None = None,
) -> list[tuple[str, Any]]:
    """``(hook_name, hook_fn)`` pairs implementing the ablation.

    One hook per ablated layer at ``hook_q`` or ``hook_z``; for a query mode on a layer
    with a shared query norm (:func:`shared_q_norm`, OLMo-2/3) two: one keeps the norm's
    input (``attn.q_norm.hook_in``), one replaces the ablated heads' slices of its output
    (``attn.hook_q_normed``) by the norm of the substituted query (module docstring).

    Raises:
        ValueError: unknown mode, a head outside the model, or a ``*_mean`` mode without
            ``means`` (or with means of another shape).
    """
    mode = check_mode(mode)
    heads = parse_heads(heads, model)
    kind, fill = mode.split("_")
    L, H, d = int(model.cfg.n_layers), int(model.cfg.n_heads), int(model.cfg.d_head)
    table = None
    if fill == "mean":
        if means is None:
            raise ValueError(f"mode {mode!r} needs calibration means (see calibrate_means)")
        if not isinstance(means, AblationMeans):
            raise ValueError(f"means must be an AblationMeans (see calibrate_means / "
                             f"AblationMeans.load), got {type(means).__name__}")
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

    def make_shared_norm(layer: int, idx: list[int], norm: torch.nn.Module) -> list[Any]:
        # q_norm mixes heads: substitute before the norm on a copy, normalise it, and write
        # back only the ablated heads' slices after the norm (module docstring).
        index = torch.tensor(idx)
        value = None if table is None else table[layer, index]  # [k, d_head]
        seen: dict[str, Tensor] = {}

        def keep(x: Tensor, hook: Any) -> None:  # the norm's input [batch, pos, H*d_head]
            seen["q"] = x

        def substitute(x: Tensor, hook: Any) -> Tensor:  # the norm's output, same shape
            q = seen.pop("q", None)
            if q is None or q.shape != x.shape or x.shape[-1] != H * d:
                raise RuntimeError(f"{hook.name}: q_norm input/output shapes "
                                   f"{None if q is None else tuple(q.shape)} / "
                                   f"{tuple(x.shape)}; expected [batch, pos, {H * d}]")
            split = (*x.shape[:-1], H, d)
            i = index.to(x.device)
            q = q.reshape(split).clone()
            q[..., i, :] = 0.0 if value is None else value.to(device=x.device, dtype=q.dtype)
            normed = norm(q.reshape(x.shape)).to(x.dtype).reshape(split)
            out = x.reshape(split).clone()
            out[..., i, :] = normed[..., i, :]
            return out.reshape(x.shape)

        return [(f"blocks.{layer}.attn.q_norm.hook_in", keep),
                (f"blocks.{layer}.attn.hook_q_normed", substitute)]

    hooks: list[tuple[str, Any]] = []
    for l, idx in sorted(by_layer.items()):
        norm = shared_q_norm(model, l) if kind == "query" else None
        if norm is not None:
            hooks += make_shared_norm(l, idx, norm)
        else:
            hooks.append((_HOOK[kind].format(l=l), make(l, idx)))
    return hooks


@contextmanager
def ablate(
    model: Any,
    heads: Sequence[HeadLike],
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

    Every mode changes only the ablated heads: the other heads of the layer keep their
    ``hook_z``. On a shared query norm (OLMo-2/3's ``q_norm`` over all heads) the query
    modes substitute after the norm, so the ablated head's query equals what the authors'
    ``q_proj`` hook gives it while the other heads are not rescaled -- unlike the
    authors' hook, which on OLMo also changes the other heads of the layer (module
    docstring; docs/concepts.md, "Ablation on OLMo").

    The hooks are registered interventions (:func:`locos_tl.engine.interventions.intervene`):
    the bridge runs them as TransformerLens hooks (the reference), and the fast SDPA
    twin runs the same functions as module hooks on ``q_proj`` (output), ``q_norm``
    (shared norm) or ``o_proj`` (input), so :func:`locos_tl.engine.forward.prefill` keeps the
    twin inside the block unless a hook the twin cannot reproduce (e.g. one a user
    attached) is also attached.

    Args:
        model: a TransformerBridge.
        heads: heads in any form of :func:`locos_tl.head_spec.parse_heads`:
            ``(layer, head)`` pairs (query-head indices), ``"L14H3"`` or ``"14-3"``;
            empty means no ablation.
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
    with intervene(model, hooks):  # removes exactly these hooks on exit / exception
        yield model


def random_heads(
    n_layers: int, n_heads: int, k: int, seed: int, *, exclude: Sequence[HeadLike] = ()
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
        ValueError: ``k`` is not an integer, is negative or larger than the heads
            available; a malformed or out-of-range head in ``exclude``.
    """
    k = as_int(k, "k")
    excluded = set(parse_heads(exclude, n_layers=n_layers, n_heads=n_heads, what="exclude"))
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
