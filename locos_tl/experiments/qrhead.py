"""QRHead: query-focused retrieval heads, scored on retrieval trials.

Zhang et al., "Query-Focused Retrieval Heads Improve Long-Context Reasoning and
Re-ranking" (EMNLP 2025, arXiv 2506.09944), and their release (``qrretriever``:
``attn_retriever.py`` ``score_docs_per_head_for_detection``,
``detect_qrhead_lme.py``). For head ``(l, h)``, the query's tokens ``Q`` (here: the
trial's question) and a document's tokens ``D`` (here: the needle span), the QR score is
the attention mass from the query to the document, summed over the document's tokens and
averaged over the query's:

    s_{l,h}(Q, D) = sum_{j in D} (1/|Q|) sum_{i in Q} alpha[l, h, i, j]

calibrated, as in-context re-ranking does (Chen et al. 2024, arXiv 2410.02642), by the
same mass when the question is replaced by a content-free null question (``"N/A"``) in
the same context:

    QR_{l,h} = s_{l,h}(Q, D) - s_{l,h}(Q_null, D).

A head's score (the paper's QRScore on a detection set) is the mean of ``QR`` over trials
(the release sums over the gold documents of an example, one here, and averages over
examples). Units: attention probability, in ``[-1, 1]``; positive: the question draws the
head's attention to the needle beyond what a content-free question does.

Differences from the release, by choice: its query span also covers the instruction
before the question and the chat template's suffix after it (here: the question's own
tokens, :func:`~locos_tl.experiments.question.question_span`), and before summing over
a document it zeroes the calibrated per-token scores below ``mean - 2 std`` of that
document's tokens (``outlier_mask=True`` does that; default off, the equations above).

Cost per trial: two forwards of the prompt up to the question's end, sharing the KV cache
of the context before the question (one prefill, then the question and the null question
on forks of it); the tokens after the question are not run (causally, they do not change
the question's attention rows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from locos_tl.engine.forward import fork_cache, prefill
from locos_tl.experiments.methods import check_trials
from locos_tl.experiments.question import (  # noqa: F401  (question_span re-exported)
    qrhead_inputs,
    question_span,
)
from locos_tl.heads import HeadScores
from locos_tl.models.load import model_dtype, model_settings
from locos_tl.runs.provenance import provenance
from locos_tl.runs.records import run_records
from locos_tl.trials import Trial, as_trial_list, trial_set_hash

RESUME_KEYS = ("model", "dtype", "method", "null_question", "span", "outlier_mask")


def _rows(model: Any, cache: Any, ids: Sequence[int], start: int,
          ) -> Float[Tensor, "n_layers n_heads n_query pos"]:
    """Attention rows of the queries ``ids`` run at positions ``[start, start + q)`` on
    (a fork of) ``cache``, at absolute key positions (a sliding-window layer's row is
    right-aligned, zeros before the window), float64."""
    L, K = int(model.cfg.n_layers), start + len(ids)
    out: dict[int, Tensor] = {}

    def keep(pattern: Tensor, hook: Any) -> None:  # [1, n_heads, q, keys]
        got = pattern[0].detach().to(torch.float64)
        full = got.new_zeros(*got.shape[:2], K)
        full[..., K - got.shape[-1] :] = got
        out[int(hook.name.split(".")[1])] = full

    device = next(model.original_model.parameters()).device
    with torch.no_grad():
        model.run_with_hooks(torch.tensor([list(ids)], device=device), return_type=None,
                             fwd_hooks=[(f"blocks.{l}.attn.hook_pattern", keep)
                                        for l in range(L)],
                             past_key_values=fork_cache(model, cache), use_cache=True)
    return torch.stack([out[l] for l in range(L)]).cpu()


def qr_scores(
    rows: Float[Tensor, "n_layers n_heads n_query pos"],
    null_rows: Float[Tensor, "n_layers n_heads n_null pos_null"],
    span: tuple[int, int],
    outlier_mask: bool = False,
) -> Float[Tensor, "n_layers n_heads"]:
    """Calibrated QR score of every head (module docstring) from the question's and the
    null question's attention rows; ``span`` ``[s, e)`` lies before both.

    With ``outlier_mask`` (the release's), per-token scores below ``mean - 2 std`` over
    the span (unbiased std; needs 2 span tokens, else no mask) are zeroed before the sum.
    """
    s, e = span
    per_token = rows[..., s:e].mean(2) - null_rows[..., s:e].mean(2)  # [L, H, e - s]
    if outlier_mask and e - s > 1:
        thr = per_token.mean(-1, keepdim=True) - 2 * per_token.std(-1, keepdim=True)
        per_token = per_token * (per_token > thr)
    return per_token.sum(-1)


def qrhead_trial(
    model: Any, trial: Trial, *, null_question: str | Sequence[int] = "N/A",
    span: str = "needle", outlier_mask: bool = False,
) -> dict[str, Any]:
    """QRHead of every head on one trial; a JSON-serialisable record: ``trial_id``,
    ``accepted`` (True), ``question_span``, ``null_tokens``, ``scores["qrhead"]``
    (``[n_layers][n_heads]``), ``mass_question`` and ``mass_null`` (the two uncalibrated
    masses ``s``), ``n_forwards`` (2).

    Raises:
        TrialError: no question; the span is not before it; an
            empty null question (:func:`~locos_tl.experiments.question.qrhead_inputs`).
    """
    (a, b), (s, e), null_ids = qrhead_inputs(model.tokenizer, trial, span, null_question)
    device = next(model.original_model.parameters()).device
    cache = prefill(model, torch.tensor([list(trial.tokens[:a])], device=device))
    rows = _rows(model, cache, trial.tokens[a:b], a)
    null_rows = _rows(model, cache, null_ids, a)
    zero = torch.zeros_like(null_rows[..., :1, :])
    return {"trial_id": trial.trial_id, "accepted": True, "dropped": None,
            "meta": trial.meta, "question_span": [a, b], "null_tokens": null_ids,
            "scores": {"qrhead": qr_scores(rows, null_rows, (s, e), outlier_mask).tolist()},
            "mass_question": qr_scores(rows, zero, (s, e)).tolist(),
            "mass_null": qr_scores(null_rows, zero, (s, e)).tolist(), "n_forwards": 2}


def qrhead_heads(
    model: Any,
    trials: Any,  # Sequence[Trial]; one bare Trial is refused (as_trial_list)
    *,
    null_question: str | Sequence[int] = "N/A",
    span: str = "needle",
    outlier_mask: bool = False,
    out_dir: str | Path | None = None,
    progress: bool = True,
    on_resume: Callable[[int, int], None] | None = None,
) -> HeadScores:
    """QRHead score of every head (module docstring), mean over trials.

    Args:
        model: a TransformerBridge.
        trials: trials whose question can be located
            (:func:`~locos_tl.experiments.question.question_span`).
        null_question: the content-free question (text, with the question's leading
            space; or token ids), ``"N/A"`` as in the paper.
        span: the document: ``"needle"`` (default) or ``"answer"`` (``Trial.span``).
        outlier_mask: the release's per-token outlier mask (module docstring).
        out_dir: run directory (``trials.jsonl``, ``meta.json``); resumable.
        progress: tqdm bar over trials.
        on_resume: with ``out_dir``, called once as ``on_resume(n_reused, n_trials)``.

    Returns:
        ``HeadScores(method="qrhead")``: ``[n_trials, n_layers, n_heads]`` calibrated
        attention mass (probability; ``meta["units"]``). Every trial counts.

    Raises:
        ValueError: unknown span.
        TrialError: a bare Trial; trials without a locatable question, with the span
            not before the question or that do not fit the model, all named in one
            error before any forward pass
            (:func:`~locos_tl.experiments.methods.check_trials`).
        LocosError: ``out_dir`` holds a run with other settings or trials.
    """
    if span not in ("needle", "answer"):
        raise ValueError(f"unknown span {span!r}; use 'needle' or 'answer'")
    trials = as_trial_list(trials, "qrhead_heads")
    check_trials(model, trials, ["qrhead"], where="qrhead_heads", spans={"qrhead": span},
                 null_question=null_question)  # every trial, before any forward pass
    settings = {**model_settings(model), "dtype": model_dtype(model), "method": "qrhead",
                "null_question": null_question if isinstance(null_question, str)
                else [int(x) for x in null_question], "span": span,
                "outlier_mask": bool(outlier_mask), "n_trials": len(trials),
                "trial_set_hash": trial_set_hash(trials)}
    meta = provenance(model, settings)
    records = run_records(
        trials, lambda t: qrhead_trial(model, t, null_question=null_question, span=span,
                                       outlier_mask=outlier_mask),
        out_dir=out_dir, settings=settings, check_keys=RESUME_KEYS, meta=meta,
        desc="QRHead", progress=progress, on_resume=on_resume)
    counts = {"n_trials": len(records), "n_accepted": len(records)}
    return HeadScores.from_records(
        records, "qrhead", n_layers=int(model.cfg.n_layers), n_heads=int(model.cfg.n_heads),
        meta={**meta, **counts, "units": "attention probability", "span": span})
