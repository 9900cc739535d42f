"""Causal retrieval importance (CRI): per-head activation patching, clean -> corrupted.

docs/concepts.md (Gema, Alex & Minervini 2026, arXiv 2607.01002, causal baseline): for
each trial build a *corrupted* prompt (the needle replaced by as many filler tokens, or
the character name swapped), run it, and for every head ``(l, h)`` rerun it with the
head's output ``hook_z`` taken from the clean run at every position. At the position
before the first answer token the metric is

    m = logit[gold] - logit[c],   c = argmax of the corrupted run's logits, gold excluded

and ``CRI(l, h) = E_trials[m(patched_{l,h}) - m(corrupted)]`` (logits). A head that
carries the needle's answer to the output has a large positive CRI.

Cost: the per-head patched runs are batched (batch axis = heads, ``batch_size`` at a
time), so one trial costs ``2 + ceil(n_layers * n_heads / batch_size)`` forward calls
instead of ``n_layers * n_heads + 2``. The tokens before the needle are the same in
every run and so are their activations (causal attention): their KV cache is computed
once and every run starts at the needle, which removes the share of the compute the
prefix would take (about half at a 50 % needle depth). Long prompts run in query chunks
with a KV cache (the bridge's eager attention holds ``batch x n_heads x chunk x N``
scores per layer). The clean/corrupted pair, the clean run and the metric are AtP's too
(:mod:`locos_tl.experiments.clean_corrupted`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any, get_args

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from locos_tl.engine.prefix import DEFAULT_PREFIX_BYTES, keep_resid_pre, start_at_layer
from locos_tl.errors import warn_caller
from locos_tl.experiments.clean_corrupted import (
    clean_corrupted_pair,
    clean_run,
    copy_cache,
    last_logits,
    logit_diff,
)
from locos_tl.experiments.corruption import (  # re-exported: the names stay importable here
    CORRUPTIONS,
    DEFAULT_FILLER,
    DEFAULT_SWAP_NAMES,
    AnswerPosition,
    Corruption,
    corrupt_tokens,  # noqa: F401  (locos_tl.corrupt_tokens is read here)
)
from locos_tl.experiments.methods import check_trials
from locos_tl.head_spec import as_int
from locos_tl.heads import HeadScores
from locos_tl.models.load import model_dtype, model_settings
from locos_tl.runs.provenance import provenance
from locos_tl.runs.records import RecordStore
from locos_tl.trials import Trial, as_trial_list, trial_set_hash

RESUME_KEYS = ("model", "dtype", "corruption", "answer_position", "max_new_tokens", "filler",
               "swap_names")


def default_batch_size(device: torch.device | str) -> int:
    """Heads patched per forward when not given: 16 on a GPU; 1 on CPU, where a batch
    saves calls but not FLOPs and its larger attention tensors made it slower (see
    ``benchmarks/bench_methods.py``)."""
    return 16 if torch.device(device).type == "cuda" else 1


def head_patch_hook(
    z_clean: Float[Tensor, "pos n_heads d_head"],
    pairs: Sequence[tuple[int, int]],
    state: dict[str, int],
    offset: int = 0,
) -> Callable[[Tensor, Any], Tensor]:
    """A ``hook_z`` hook writing the clean run's output of one head per batch row.

    Row ``i`` of the batch gets head ``h``'s clean ``hook_z`` for each ``(i, h)`` in
    ``pairs``; every other head of the layer (and every other row) keeps the corrupted
    run's value, so patching head ``(l, h)`` changes no other head's ``hook_z`` at layer
    ``l`` (``hook_z`` is per head, after QK-norm, attention and before ``W_O``, so no norm
    mixes heads there on any architecture).

    Args:
        z_clean: the clean run's ``hook_z`` of this layer at absolute positions
            ``[offset, offset + pos)``.
        pairs: ``(batch row, head)`` pairs.
        state: ``state["start"]``: absolute position of the current chunk's first query.
        offset: absolute position of ``z_clean[0]``.

    Returns:
        The hook (returns a patched copy of ``[batch, chunk, n_heads, d_head]``).
    """
    rows = torch.tensor([i for i, _ in pairs], device=z_clean.device)
    cols = torch.tensor([h for _, h in pairs], device=z_clean.device)

    def patch(x: Tensor, hook: Any) -> Tensor:  # [batch, chunk, n_heads, d_head]
        a = state["start"] - offset
        src = z_clean[a : a + x.shape[1]]  # [chunk, n_heads, d_head]
        x = x.clone()
        x[rows.to(x.device), :, cols.to(x.device)] = (
            src[:, cols].transpose(0, 1).to(device=x.device, dtype=x.dtype))
        return x

    return patch


def cri_trial(
    model: Any,
    trial: Trial,
    *,
    corruption: Corruption = "filler",
    batch_size: int | None = None,
    chunk_size: int = 1024,
    answer_position: AnswerPosition = "generated",
    max_new_tokens: int = 50,
    filler: str | Sequence[int] = DEFAULT_FILLER,
    swap_names: Sequence[str] = DEFAULT_SWAP_NAMES,
    share_prefix: bool = True,
    reuse_prefix: bool = True,
    prefix_bytes: int = DEFAULT_PREFIX_BYTES,
) -> dict[str, Any]:
    """CRI of every head on one trial; returns a JSON-serialisable record.

    Arguments as in :func:`patch_heads`; ``share_prefix=False`` reruns the tokens before
    the needle in every run (same result, for benchmarks).

    Record fields: ``trial_id``, ``accepted``, ``dropped`` (None or
    ``"no_answer_step"``), ``gold``, ``counterfactual``, ``metric_clean``,
    ``metric_corrupted`` (logits), ``scores["cri"]`` (``[n_layers][n_heads]``, logits),
    ``n_forwards``.

    Raises:
        ValueError, TrialError: see :func:`corrupt_tokens`; ``batch_size < 1``.
    """
    device = next(model.original_model.parameters()).device
    batch_size = default_batch_size(device) if batch_size is None else batch_size
    if as_int(batch_size, "batch_size") < 1:
        raise ValueError("batch_size must be >= 1")
    L, H = int(model.cfg.n_layers), int(model.cfg.n_heads)
    record, pair = clean_corrupted_pair(
        model, trial, corruption, answer_position=answer_position,
        max_new_tokens=max_new_tokens, filler=filler, swap_names=swap_names)
    if pair is None:
        return record
    prefix, golds, clean, corr, shared = pair
    # Positions before the first corrupted token are identical in every run (causal
    # attention): compute their KV cache once and run only the rest, clean, corrupted and
    # patched alike.
    shared = shared if share_prefix else 0
    prefix_cache, z_clean, clean_logits, gold = clean_run(
        model, clean, golds, shared=shared, chunk_size=chunk_size)
    z = {l: torch.cat(parts) for l, parts in z_clean.items()}  # [pos - shared, H, d_head]
    # patching a head of layer l leaves the corrupted run's layers below l as they were:
    # keep its resid_pre (positions [shared, P), one query chunk) to start from layer l
    n_run = corr.shape[1] - shared
    reuse = reuse_prefix and n_run <= chunk_size
    with keep_resid_pre(model, range(1, L) if reuse else (), n_run,
                        max_bytes=prefix_bytes) as resid:
        corr_logits = last_logits(model, corr, chunk_size=chunk_size, start=shared,
                                   cache=copy_cache(prefix_cache))[0]
    masked = corr_logits.clone()
    masked[gold] = float("-inf")
    cf = int(masked.argmax())
    m_corr = float(logit_diff(corr_logits, gold, cf))

    heads = [(l, h) for l in range(L) for h in range(H)]
    cri = torch.zeros(L, H, dtype=torch.float64)
    state = {"start": shared}
    n_forwards = 2
    for b0 in range(0, len(heads), batch_size):
        batch = heads[b0 : b0 + batch_size]
        by_layer: dict[int, list[tuple[int, int]]] = {}
        for i, (l, h) in enumerate(batch):
            by_layer.setdefault(l, []).append((i, h))

        hooks = [(f"blocks.{l}.attn.hook_z", head_patch_hook(z[l], pairs, state, shared))
                 for l, pairs in by_layer.items()]
        ids = corr.expand(len(batch), -1).contiguous()  # batch axis = patched heads
        low = min(by_layer)
        with (start_at_layer(model, low, resid[low]) if low in resid else nullcontext()):
            logits = last_logits(model, ids, chunk_size=chunk_size, start=shared,
                                  cache=copy_cache(prefix_cache, len(batch)),
                                  fwd_hooks=hooks, state=state)
        n_forwards += 1
        m = logit_diff(logits, gold, cf) - m_corr
        for i, (l, h) in enumerate(batch):
            cri[l, h] = float(m[i])
    record.update({
        "accepted": True, "gold": gold, "counterfactual": cf, "prefix_len": len(prefix),
        "metric_clean": float(logit_diff(clean_logits, gold, cf)),
        "metric_corrupted": m_corr, "scores": {"cri": cri.tolist()},
        "n_forwards": n_forwards, "shared_prefix": shared,
    })
    return record


def patch_heads(
    model: Any,
    trials: Any,  # Sequence[Trial]; one bare Trial is refused (as_trial_list)
    *,
    corruption: Corruption = "filler",
    batch_size: int | None = None,
    chunk_size: int = 1024,
    answer_position: AnswerPosition = "generated",
    max_new_tokens: int = 50,
    filler: str | Sequence[int] = DEFAULT_FILLER,
    swap_names: Sequence[str] = DEFAULT_SWAP_NAMES,
    out_dir: str | Path | None = None,
    progress: bool = True,
    on_resume: Callable[[int, int], None] | None = None,
    extend: bool = False,
    reuse_prefix: bool = True,
) -> HeadScores:
    """Causal retrieval importance of every head (docs/concepts.md), over trials.

    Args:
        model: a TransformerBridge.
        trials: retrieval trials.
        corruption: ``"filler"`` (default) or ``"name_swap"`` (see :func:`corrupt_tokens`).
        batch_size: heads patched per batched forward (memory grows linearly with it:
            the bridge's eager attention holds ``batch x n_heads x chunk x N`` scores);
            default :func:`default_batch_size` (16 on a GPU, 1 on CPU).
        chunk_size: query positions per forward (KV-cache prefill).
        answer_position: ``"generated"``: the metric is read before the first answer
            token of the clean run's greedy response (trials whose response lacks the
            answer are dropped); ``"prompt_end"``: at the last prompt token, gold = the
            first token of the answer (teacher forcing).
        max_new_tokens: greedy budget to find the answer (``"generated"``).
        filler, swap_names: see :func:`corrupt_tokens`.
        out_dir: run directory (``trials.jsonl``, ``meta.json``); resumable.
        progress: tqdm bar over trials.
        on_resume: with ``out_dir``, called once before any patching as
            ``on_resume(n_reused, n_trials)`` (its own reuse rule; ``locos patch``
            prints it).
        extend: let ``out_dir`` hold a run over a subset of ``trials`` (grow a run from
            3 to 20 trials keeping the 3 finished ones); a run over trials outside
            ``trials`` is still refused.
        reuse_prefix: run each patched forward from the patched heads' lowest layer on
            the corrupted run's residual stream entering it (:mod:`locos_tl.engine.prefix`;
            the SDPA twin, the corrupted positions within one ``chunk_size``, at most
            1 GiB of it kept, highest layers first): patching a head leaves the layers
            below it unchanged. ``False`` runs every layer.

    Returns:
        ``HeadScores(method="cri")``: ``[n_trials, n_layers, n_heads]`` per-trial CRI in
        logits (gold minus counterfactual logit gained by patching the head); meta counts
        dropped trials.

    Raises:
        ValueError: unknown corruption or answer position.
        TrialError: ``trials`` is one bare Trial (pass a list) or holds a
            non-Trial; trials that do not fit the model (the prompt, plus
            ``max_new_tokens`` with ``"generated"``) or cannot be corrupted, all named
            in one error before any forward pass
            (:func:`~locos_tl.experiments.methods.check_trials`).
        LocosError: ``out_dir`` holds a run with other settings or another trial set
            (with ``extend``: over a trial that is not in ``trials``).

    Warns:
        RuntimeWarning: no trial was usable (every CRI is NaN).
    """
    if answer_position not in get_args(AnswerPosition):
        raise ValueError(f"unknown answer_position {answer_position!r}; use one of "
                         f"{list(get_args(AnswerPosition))}")
    if corruption not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {corruption!r}; use one of {list(CORRUPTIONS)}")
    trials = as_trial_list(trials, "patch_heads")
    check_trials(model, trials, ["cri"], where="patch_heads", max_new_tokens=max_new_tokens,
                 answer_position=answer_position, corruption=corruption, filler=filler,
                 swap_names=swap_names)  # every trial, before any forward pass
    if batch_size is None:
        batch_size = default_batch_size(next(model.original_model.parameters()).device)
    settings = {**model_settings(model), "dtype": model_dtype(model), "method": "cri",
                "corruption": corruption, "filler": filler if isinstance(filler, str)
                else [int(x) for x in filler], "swap_names": list(swap_names),
                "answer_position": answer_position, "max_new_tokens": max_new_tokens,
                "batch_size": batch_size, "reuse_prefix": bool(reuse_prefix),
                "n_trials": len(trials),
                "trial_set_hash": trial_set_hash(trials)}
    store = (RecordStore(out_dir, settings, RESUME_KEYS,
                         extend_to={t.trial_id for t in trials} if extend else None)
             if out_dir is not None else None)
    meta = provenance(model, settings)
    if store is not None:
        store.write_meta(meta)
    reused = [store.get(t.trial_id) if store is not None else None for t in trials]
    if on_resume is not None and store is not None:
        on_resume(sum(r is not None for r in reused), len(trials))
    records = []
    for t, rec in zip(tqdm(trials, desc="patching heads", unit="trial",
                           disable=not progress), reused, strict=True):
        if rec is None:
            rec = cri_trial(model, t, corruption=corruption, batch_size=batch_size,
                            chunk_size=chunk_size, answer_position=answer_position,
                            max_new_tokens=max_new_tokens, filler=filler, swap_names=swap_names,
                            reuse_prefix=reuse_prefix)
            if store is not None:
                store.append(rec)
        records.append(rec)
    counts = {"n_trials": len(records), "n_accepted": sum(bool(r["accepted"]) for r in records),
              "n_dropped_no_answer_step": sum(r["dropped"] == "no_answer_step" for r in records)}
    if records and counts["n_accepted"] == 0:
        warn_caller(
            f"patch_heads: no usable trial: 0 of {counts['n_trials']} "
            f"({counts['n_dropped_no_answer_step']} greedy responses lack the answer within "
            f"max_new_tokens={max_new_tokens}); every CRI is NaN and rankings refuse. Use "
            "trials the model answers, or answer_position='prompt_end'",
            RuntimeWarning)
    return HeadScores.from_records(records, "cri", n_layers=int(model.cfg.n_layers),
                                   n_heads=int(model.cfg.n_heads), meta={**meta, **counts})

