"""From per-trial records to :class:`~locos_tl.heads.HeadScores`: the one path, for a
finished run (:class:`locos_tl.runs.runner.ScoringRun`) and for a run directory read
back (:func:`locos_tl.runs.rundir.load_head_scores`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from locos_tl.acceptance import acceptance_counts
from locos_tl.errors import warn_caller
from locos_tl.heads import HeadScores


def _span_used(records: Sequence[dict[str, Any]], method: str) -> str | list[str] | None:
    """The span name ``method`` read in ``records`` (a sorted list when they differ)."""
    used = sorted({str(sp) for r in records
                   if (sp := (r.get("spans") or {}).get(method)) is not None})
    return used[0] if len(used) == 1 else (used or None)


def aggregate(
    records: Sequence[dict[str, Any]],
    methods: Sequence[str],
    *,
    model: Any,
    variant: str,
    meta: dict[str, Any],
    seed: int = 0,
    as_dict: bool | None = None,
    warn: bool = True,
) -> HeadScores | dict[str, HeadScores]:
    """Build :class:`HeadScores` from per-trial records (order-independent): the one
    path from records to scores, for a finished run (:class:`ScoringRun`) and for a run
    directory read back (:func:`locos_tl.runs.rundir.load_head_scores`).

    Returns a ``{method: HeadScores}`` dict when ``as_dict`` (default: when there are
    several methods), else the one method's :class:`HeadScores`.

    Acceptance is per method (:mod:`locos_tl.acceptance`): each method's ``meta`` holds
    its own ``n_trials``, ``n_accepted`` and ``n_dropped_<reason>`` counts, the ``span``
    it read (the span name, or a list when records differ), and ``acceptance`` (every
    method's counts: those of ``methods`` over ``meta["acceptance"]``).

    ``model`` needs only ``cfg.n_layers`` and ``cfg.n_heads``. Warns (``RuntimeWarning``,
    with the drop counts) when a method accepted no trial, unless ``warn=False``.
    """
    per_method = {m: acceptance_counts(records, m) for m in methods}
    acceptance = {**(meta.get("acceptance") or {}), **per_method}
    for m, counts in per_method.items():
        if warn and records and counts["n_accepted"] == 0:
            warn_caller(
                f"{m}: no trial was accepted: 0 of {counts['n_trials']} ("
                f"{counts['n_dropped_gate']} failed the gate, "
                f"{counts['n_dropped_no_answer_step']} had no answer step, "
                f"{counts['n_dropped_non_finite']} had NaN/inf numbers); every head score "
                "is NaN and rankings (top_k, ranked) refuse", RuntimeWarning)
    L, H = int(model.cfg.n_layers), int(model.cfg.n_heads)
    out = {
        m: HeadScores.from_records(
            records, m, n_layers=L, n_heads=H, variant=variant, seed=seed,
            meta={**meta, **per_method[m], "span": _span_used(records, m),
                  "acceptance": acceptance})
        for m in methods
    }
    if as_dict is None:
        as_dict = len(methods) > 1
    return out if as_dict else out[methods[0]]
