"""Causal ground truth of the organism, with plain PyTorch hooks on the HF model.

Independent of LOCOS and of TransformerLens on purpose: heads are ablated or patched
at the input of ``self_attn.o_proj`` (the concatenated per-head outputs ``z``, shape
``[batch, pos, n_heads * d_head]``; head ``h`` owns columns ``h*d_head:(h+1)*d_head``).

- :func:`accuracy`: greedy next-token accuracy at the question (answers are one token).
- :func:`ablate_heads`: zero- or mean-ablate head outputs (context manager).
- :func:`attention_profile`: where each head's final-position query looks (needle
  landmark, needle name, other names, other landmarks, rest) and each layer-0 head's
  previous-token attention from landmark positions.
- :func:`patching`: activation patching clean -> corrupted, per head, as the fraction of
  the logit difference recovered.
- :func:`ground_truth`: all of the above, assembled into the documented head roles.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from locos_tl.head_spec import HeadLike, parse_heads
from locos_tl.organisms import vocab as V
from locos_tl.organisms.tasks import (
    ContextSpec,
    Example,
    Task,
    ids_table,
    make_example,
)

Head = tuple[int, int]


def load_hf(path: str | Path, attn: str = "eager") -> Any:
    """The organism as a plain ``transformers`` model in eval mode (float32, CPU).

    Args:
        path: checkpoint directory.
        attn: ``"eager"`` (needed for attention patterns) or ``"sdpa"``.
    """
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation=attn)
    m.eval()
    return m


def _layers(model: Any) -> Any:
    return model.model.layers


def _dims(model: Any) -> tuple[int, int, int]:
    c = model.config
    return c.num_hidden_layers, c.num_attention_heads, c.head_dim


def _tokens(x: Any) -> list[int]:
    return list(x.tokens) if hasattr(x, "tokens") else list(x.ids)


def _answer_id(x: Any) -> int:
    if hasattr(x, "answer_id"):
        return int(x.answer_id)
    return V.token_to_id()[x.answer]


def _by_length(items: Sequence[Any]) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = defaultdict(list)
    for i, x in enumerate(items):
        groups[len(_tokens(x))].append(i)
    return groups


@torch.no_grad()
def final_logits(model: Any, items: Sequence[Any], batch_size: int | None = None) -> torch.Tensor:
    """Logits at the last prompt position.

    Args:
        model: HF causal LM.
        items: :class:`~locos_tl.trials.Trial` or :class:`Example` objects (any lengths).
        batch_size: prompts per forward; ``None``: about 16k tokens per forward.

    Returns:
        float32 ``[len(items), vocab]``.
    """
    out = torch.empty(len(items), model.config.vocab_size)
    cost, budget = ((lambda n: 1), batch_size) if batch_size else ((lambda n: n), 16384)
    for chunk in _length_chunks(items, cost, budget):
        ids = torch.tensor([_tokens(items[i]) for i in chunk])
        out[chunk] = model(input_ids=ids, logits_to_keep=1).logits[:, -1].float()
    return out


def _length_chunks(items: Sequence[Any], cost: Any, budget: int) -> Iterator[list[int]]:
    """Index lists of same-length items, each chunk costing about ``budget``
    (``cost(n_tokens)`` per item)."""
    for n_tok, idx in _by_length(items).items():
        bs = _chunk(cost(n_tok), budget)
        for k in range(0, len(idx), bs):
            yield idx[k : k + bs]


def _chunk(n_tokens: int, budget: int) -> int:
    """Prompts per forward so that a chunk holds about ``budget`` tokens (at least 1)."""
    return max(1, budget // max(n_tokens, 1))


def accuracy(model: Any, items: Sequence[Any]) -> float:
    """Greedy accuracy: fraction of prompts whose argmax next token is the answer."""
    if not items:
        return float("nan")
    lg = final_logits(model, items)
    ans = torch.tensor([_answer_id(x) for x in items])
    return int((lg.argmax(-1) == ans).sum()) / len(items)


@torch.no_grad()
def head_means(model: Any, items: Sequence[Any]) -> torch.Tensor:
    """Mean head output ``z`` over all positions of ``items`` (for mean ablation).

    Returns:
        ``[n_layers, n_heads, d_head]``.
    """
    L, H, D = _dims(model)
    sums = torch.zeros(L, H * D)
    count = 0
    handles = []

    def mk(layer: int):
        def pre(mod, args):
            nonlocal count
            x = args[0]
            sums[layer] += x.reshape(-1, H * D).sum(0)
            if layer == 0:
                count += x.shape[0] * x.shape[1]
        return pre

    for l_, layer in enumerate(_layers(model)):
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(mk(l_)))
    try:
        final_logits(model, items)
    finally:
        for h in handles:
            h.remove()
    return (sums / max(count, 1)).view(L, H, D)


@contextlib.contextmanager
def ablate_heads(
    model: Any,
    heads: Sequence[HeadLike],
    mode: Literal["zero", "mean"] = "zero",
    means: torch.Tensor | None = None,
) -> Iterator[None]:
    """Replace the outputs of ``heads`` at every position (zero or mean ablation).

    Args:
        model: HF Qwen3-style model (``model.model.layers[l].self_attn.o_proj``).
        heads: ``[(layer, head), ...]``.
        mode: ``"zero"`` or ``"mean"`` (needs ``means`` from :func:`head_means`).
        means: ``[n_layers, n_heads, d_head]``.

    Raises:
        ValueError: ``mode="mean"`` without ``means``; a malformed head or one out of
            range (``HeadSpecError``, see :func:`locos_tl.head_spec.parse_heads`).
    """
    L, H, D = _dims(model)
    if mode == "mean" and means is None:
        raise ValueError("mean ablation needs `means` (see head_means)")
    per_layer: dict[int, list[int]] = defaultdict(list)
    for l_, h in parse_heads(heads, n_layers=L, n_heads=H):
        per_layer[l_].append(h)
    handles = []

    def mk(layer: int, hs: list[int]):
        def pre(mod, args):
            x = args[0].clone()
            for h in hs:
                if mode == "zero":
                    x[..., h * D : (h + 1) * D] = 0.0
                else:
                    x[..., h * D : (h + 1) * D] = means[layer, h].to(x.dtype)
            return (x,) + tuple(args[1:])
        return pre

    for l_, hs in per_layer.items():
        mod = _layers(model)[l_].self_attn.o_proj
        handles.append(mod.register_forward_pre_hook(mk(l_, hs)))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def attention_profile(model: Any, examples: Sequence[Example]) -> dict[str, np.ndarray]:
    """Where each head's query at the question position attends, averaged over prompts.

    Runs with eager attention (``output_attentions=True``; switched on for the call).

    Returns:
        dict of ``[n_layers, n_heads]`` arrays: ``needle_landmark``, ``needle_name``,
        ``other_names`` (lone and distractor-pair names), ``other_landmarks``, ``rest``
        (fractions of attention mass at the last position); ``prev_token_from_landmark``
        (mean attention of every landmark position to the token before it).
    """
    t = ids_table()
    names, lms = set(t.names.tolist()), set(t.landmarks.tolist())
    L, H, _ = _dims(model)
    acc = {k: np.zeros((L, H)) for k in
           ("needle_landmark", "needle_name", "other_names", "other_landmarks", "rest",
            "prev_token_from_landmark")}
    with _eager(model):
        return _attention_profile(model, examples, acc, names, lms, L, H)


@contextlib.contextmanager
def _eager(model: Any) -> Iterator[None]:
    """Eager attention for the duration (attention weights need it); restored after."""
    prev = model.config._attn_implementation
    if prev != "eager":
        model.set_attn_implementation("eager")
    try:
        yield
    finally:
        if prev != "eager":
            model.set_attn_implementation(prev)


def _attention_profile(model: Any, examples: Sequence[Example], acc: dict, names: set,
                       lms: set, L: int, H: int) -> dict[str, np.ndarray]:
    n_prev = 0
    # eager attention rows cost B*H*P*P floats per layer: about 2^23 per forward
    for idx in _length_chunks(examples, lambda n: n * n * H, 1 << 23):
        ids = torch.tensor([examples[i].ids for i in idx])
        att = model(input_ids=ids, output_attentions=True, logits_to_keep=1).attentions
        for b, i in enumerate(idx):
            ex = examples[i]
            s, _e = ex.needle_span
            toks = ex.ids
            other_n = [j for j, x in enumerate(toks[:-2]) if x in names and j != s]
            other_l = [j for j, x in enumerate(toks[:-2]) if x in lms and j != s + 1]
            lm_pos = [j for j, x in enumerate(toks[:-2]) if x in lms]
            for l_ in range(L):
                row = att[l_][b, :, -1].numpy()  # [H, P]
                acc["needle_landmark"][l_] += row[:, s + 1]
                acc["needle_name"][l_] += row[:, s]
                acc["other_names"][l_] += row[:, other_n].sum(-1)
                acc["other_landmarks"][l_] += row[:, other_l].sum(-1)
                acc["rest"][l_] += 1 - row[:, [s, s + 1, *other_n, *other_l]].sum(-1)
                a = att[l_][b].numpy()
                acc["prev_token_from_landmark"][l_] += np.mean(
                    [a[:, j, j - 1] for j in lm_pos], axis=0)
            n_prev += 1
    return {k: v / max(n_prev, 1) for k, v in acc.items()}


def corrupt(ex: Example, rng: np.random.Generator) -> tuple[Example, int]:
    """Counterfactual prompt: the needle's answer-bearing token swapped for a fresh one.

    Literal: the needle LANDMARK becomes a landmark of a city absent from the context
    (answer changes to it). Non-literal: the needle NAME becomes a name absent from the
    context (answer changes to it). Same length, same positions.

    Returns:
        ``(corrupted_example, corrupted_answer_id)``.
    """
    t = ids_table()
    s, _ = ex.needle_span
    ids = list(ex.ids)
    if ex.task == "nonliteral":
        present = set(ids)
        new = int(rng.choice([n for n in t.names.tolist() if n not in present]))
        ids[s] = new
    else:
        present_c = {t.city_of_lm[x] for x in ids if x in t.city_of_lm}
        cands = [lm for lm in t.landmarks.tolist() if t.city_of_lm[lm] not in present_c]
        new = int(rng.choice(cands))
        ids[s + 1] = new
    vl = V.vocab_list()
    ex2 = Example(ids, ex.needle_span, new, ex.task,
                  vl[ids[s]], vl[ids[s + 1]], ex.city)
    return ex2, new


@torch.no_grad()
def _z_cache(model: Any, ids: torch.Tensor) -> list[torch.Tensor]:
    zs: list[torch.Tensor] = []
    handles = [layer.self_attn.o_proj.register_forward_pre_hook(
        lambda mod, args: zs.append(args[0].detach().clone())) for layer in _layers(model)]
    try:
        model(input_ids=ids, logits_to_keep=1)
    finally:
        for h in handles:
            h.remove()
    return zs


@torch.no_grad()
def patching(
    model: Any,
    examples: Sequence[Example],
    seed: int = 0,
    positions: Literal["all", "last"] = "all",
) -> dict[str, Any]:
    """Per-head activation patching, clean -> corrupted (see :func:`corrupt`).

    For each head, its output ``z`` from the clean run replaces the corrupted run's at
    ``positions`` (all positions, or only the last); the metric is the logit difference
    ``LD = logit[clean answer] - logit[corrupted answer]`` at the last position.

    Args:
        examples: prompts of ONE task and ONE length.

    Returns:
        ``{"recovered": [n_layers, n_heads] array}`` (mean over prompts of
        ``(LD_patched - LD_corr) / (LD_clean - LD_corr)``; 1 = the head alone restores the
        clean answer preference), ``"ld_clean"``, ``"ld_corr"`` (means), and
        ``"acc_patched"`` ``[n_layers, n_heads]``: fraction of prompts whose patched argmax
        is the clean answer.
    """
    L, H, D = _dims(model)
    rng = np.random.default_rng(seed)
    pairs = [corrupt(ex, rng) for ex in examples]
    rec = np.zeros((L, H))
    accp = np.zeros((L, H))
    ld_clean_sum = ld_corr_sum = 0.0
    # one chunk at a time: long prompts do not fit in one forward
    for idx in _length_chunks(examples, lambda n: n, 16384):
        clean = torch.tensor([examples[i].ids for i in idx])
        corr = torch.tensor([pairs[i][0].ids for i in idx])
        a_clean = torch.tensor([examples[i].answer_id for i in idx])
        a_corr = torch.tensor([pairs[i][1] for i in idx])
        ar = torch.arange(len(idx))

        def ld(logits: torch.Tensor, a_clean=a_clean, a_corr=a_corr, ar=ar) -> torch.Tensor:
            last = logits[:, -1]
            return last[ar, a_clean] - last[ar, a_corr]

        z_clean = _z_cache(model, clean)
        ld_clean = ld(model(input_ids=clean, logits_to_keep=1).logits)
        ld_corr = ld(model(input_ids=corr, logits_to_keep=1).logits)
        ld_clean_sum += float(ld_clean.sum())
        ld_corr_sum += float(ld_corr.sum())
        for l_ in range(L):
            for h in range(H):
                sl = slice(h * D, (h + 1) * D)
                src = z_clean[l_]

                def pre(mod, args, sl=sl, src=src):
                    x = args[0].clone()
                    if positions == "all":
                        x[..., sl] = src[..., sl]
                    else:
                        x[:, -1, sl] = src[:, -1, sl]
                    return (x,) + tuple(args[1:])

                hd = _layers(model)[l_].self_attn.o_proj.register_forward_pre_hook(pre)
                try:
                    lg = model(input_ids=corr, logits_to_keep=1).logits
                finally:
                    hd.remove()
                r = (ld(lg) - ld_corr) / (ld_clean - ld_corr).clamp_min(1e-6)
                rec[l_, h] += float(r.sum())
                accp[l_, h] += float((lg[:, -1].argmax(-1) == a_clean).float().sum())
    n = max(len(examples), 1)
    return {"recovered": rec / n, "ld_clean": ld_clean_sum / n,
            "ld_corr": ld_corr_sum / n, "acc_patched": accp / n}


def single_head_ablation(
    model: Any, items_by_task: dict[str, Sequence[Any]], mode: str = "mean",
    means: torch.Tensor | None = None,
) -> dict[str, np.ndarray]:
    """Accuracy per task with each head ablated alone.

    Returns:
        ``{task: [n_layers, n_heads] accuracy}``.
    """
    L, H, _ = _dims(model)
    out = {k: np.zeros((L, H)) for k in items_by_task}
    for l_ in range(L):
        for h in range(H):
            with ablate_heads(model, [(l_, h)], mode, means):  # type: ignore[arg-type]
                for k, items in items_by_task.items():
                    out[k][l_, h] = accuracy(model, items)
    return out


@dataclass
class GroundTruth:
    """Documented head roles with their measured numbers (see :func:`ground_truth`)."""

    literal_copy: list[Head]
    nonliteral_writer: list[Head]
    prev_token: list[Head]
    numbers: dict[str, Any]


def examples(task: Task, n: int, n_tokens: int, seed: int,
             spec: ContextSpec | None = None) -> list[Example]:
    """``n`` fresh examples of one task and length (seeded, held out from training)."""
    spec = spec or ContextSpec()
    rng = np.random.default_rng([seed, 0 if task == "literal" else 1, n_tokens, 31])
    return [make_example(rng, n_tokens, task, spec) for _ in range(n)]


def ground_truth(
    model: Any,
    n: int = 200,
    n_tokens: int = 64,
    seed: int = 4242,
    threshold: float = 0.1,
    single: bool = True,
    n_attention: int | None = None,
) -> GroundTruth:
    """Establish head roles causally (eager HF model).

    Roles: a *literal copy* head is a head of a layer above the first whose
    clean->corrupt patching on literal prompts (needle landmark swapped) recovers
    >= ``threshold`` of the logit difference and which puts >= 0.5 of its attention on
    the needle landmark at literal questions; a *non-literal writer* likewise on
    non-literal prompts (needle name swapped), restricted to heads that attend more to the
    needle landmark than to the needle name at the question; a *previous-token mover* is a
    first-layer head whose patching on non-literal prompts recovers >= ``threshold`` and
    whose attention from landmarks to
    the previous token is >= 0.4. Group ablations of each role (zero and mean) and
    attention profiles are recorded in ``numbers``; with ``single``, also every head's
    single mean ablation (``L * H`` more passes; skipped at long lengths).
    ``n_attention`` limits the attention profiles (eager, quadratic in length) to the
    first prompts of each task.
    """
    L, H, _ = _dims(model)
    lit = examples("literal", n, n_tokens, seed)
    non = examples("nonliteral", n, n_tokens, seed)
    means = head_means(model, lit + non)
    prof_non = attention_profile(model, non[:n_attention])
    prof_lit = attention_profile(model, lit[:n_attention])
    p_lit = patching(model, lit, seed=seed)
    p_non = patching(model, non, seed=seed + 1)
    upper = [(ly, h) for ly in range(1, L) for h in range(H)]
    lit_heads = [(ly, h) for ly, h in upper
                 if p_lit["recovered"][ly, h] >= threshold
                 and prof_lit["needle_landmark"][ly, h] >= 0.5]
    non_heads = [(ly, h) for ly, h in upper
                 if p_non["recovered"][ly, h] >= threshold
                 and prof_non["needle_landmark"][ly, h] >= prof_non["needle_name"][ly, h]]
    prev = [(0, h) for h in range(H)
            if p_non["recovered"][0, h] >= threshold
            and prof_non["prev_token_from_landmark"][0, h] >= 0.4]
    base = {"literal": accuracy(model, lit), "nonliteral": accuracy(model, non)}
    single_acc = (single_head_ablation(model, {"literal": lit, "nonliteral": non}, "mean", means)
                  if single else None)
    groups: dict[str, dict[str, dict[str, float]]] = {}
    for gname, hs in (("literal_copy", lit_heads), ("nonliteral_writer", non_heads),
                      ("prev_token", prev)):
        groups[gname] = {}
        for mode in ("zero", "mean"):
            with ablate_heads(model, hs, mode, means):  # type: ignore[arg-type]
                groups[gname][mode] = {"literal": accuracy(model, lit),
                                       "nonliteral": accuracy(model, non)}
    numbers = {
        "n_prompts_per_task": n, "n_tokens": n_tokens, "seed": seed,
        "baseline": base, "group_ablation": groups,
        "single_ablation_mean": ({k: v.tolist() for k, v in single_acc.items()}
                                 if single_acc is not None else None),
        "patching_literal": p_lit["recovered"].tolist(),
        "patching_nonliteral": p_non["recovered"].tolist(),
        "attention_nonliteral": {k: v.tolist() for k, v in prof_non.items()},
        "attention_literal": {k: v.tolist() for k, v in prof_lit.items()},
    }
    return GroundTruth(lit_heads, non_heads, prev, numbers)
