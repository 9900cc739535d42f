"""Which trials each method counts: per-method acceptance read from per-trial records.

Methods accept trials by their own published rule (``Detector.drop_reason``,
docs/concepts.md protocol table): LOCOS, attention-spatial and DLA need the ROUGE-1
gate and an answer step; the Wu copy score only the gate (Wu et al. 2025, arXiv
2404.15574: every trial whose ROUGE-1 recall passes counts); HeadKV its QA-F1 gate on
the first ``|answer|`` tokens (Fu et al. 2025, arXiv 2410.19258); the HeadKV anchor
variant every trial. A record stores the decision of every method it was run for in
``dropped_by`` (method -> ``None`` or the reason); records written before per-method
acceptance have only the trial-level ``accepted``/``dropped``, which then applies to
every method.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Reasons a method drops a trial (``n_dropped_<reason>`` counts).
DROP_REASONS = ("gate", "no_answer_step", "non_finite")


def method_drop_reason(record: dict[str, Any], method: str) -> str | None:
    """Why ``method`` does not count the trial of ``record`` (None: it counts)."""
    by = record.get("dropped_by")
    if isinstance(by, dict) and method in by:
        return by[method]
    if record.get("accepted"):
        return None
    return record.get("dropped") or "unknown"


def method_accepted(record: dict[str, Any], method: str) -> bool:
    """Whether ``method`` counts the trial of ``record``."""
    return method_drop_reason(record, method) is None


def acceptance_counts(records: Sequence[dict[str, Any]], method: str) -> dict[str, int]:
    """``n_trials``, ``n_accepted`` and ``n_dropped_<reason>`` of ``method``."""
    counts = {"n_trials": len(records), "n_accepted": 0}
    counts.update({f"n_dropped_{r}": 0 for r in DROP_REASONS})
    for rec in records:
        reason = method_drop_reason(rec, method)
        key = "n_accepted" if reason is None else f"n_dropped_{reason}"
        counts[key] = counts.get(key, 0) + 1
    return counts
