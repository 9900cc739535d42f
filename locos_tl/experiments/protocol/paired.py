"""Paired tests between the ablation grid's rankings, on the same trials: McNemar's exact
test on ``contains`` and Wilcoxon's signed-rank test on the teacher-forced name margin
(:mod:`locos_tl.experiments.protocol`)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from locos_tl.experiments.stats import (  # noqa: F401  (mcnemar_p, wilcoxon_p: old path)
    _pair_row,
    _shared_ks,
    check_records,
    mcnemar_p,
    wilcoxon_p,
)

#: (ranking, against) pairs tested at every k both have; "random" pools its seeds
PAIRS: tuple[tuple[str, str], ...] = (
    ("locos", "random"), ("wu", "random"), ("wu_niah", "random"), ("dla", "random"),
    ("attention_spatial", "random"), ("headkv", "random"), ("atp", "random"),
    ("qrhead", "random"),
    ("locos", "wu"), ("locos", "wu_niah"), ("locos", "dla"),
    ("locos", "atp"), ("locos", "qrhead"),
)


def paired_table(values: pd.DataFrame, pairs: Sequence[tuple[str, str]] = PAIRS
                 ) -> pd.DataFrame:
    """One row per (pair, k) that both rankings have, on the trials both hold.

    Args:
        values: per-trial scores of one sweep
            (:func:`locos_tl.experiments.protocol.tables.trial_values`).
        pairs: (ranking, against) names.

    Returns:
        Columns ``method``, ``against``, ``k``, ``n_trials``, ``contains`` and
        ``contains_against`` (means, fraction of answers naming the target),
        ``p_mcnemar`` (against random: the largest p over its seeds, each seed tested
        alone), ``name_margin`` and ``name_margin_against`` (means, nats) and
        ``p_wilcoxon`` (against random: its seeds averaged per trial); NaN where the
        records hold no name margin.

    Raises:
        ValueError: as :func:`locos_tl.paired_tests`: a record held twice, a
            ``contains`` not 0 or 1, two rankings at a k over different trials.
    """
    check_records(values, {m for pair in pairs for m in pair})
    rows = [r for method, against in pairs for k in _shared_ks(values, method, against)
            if (r := _pair_row(values, method, against, k)) is not None]
    cols = ["method", "against", "k", "n_trials", "contains", "contains_against",
            "p_mcnemar", "name_margin", "name_margin_against", "p_wilcoxon"]
    return pd.DataFrame(rows).rename(columns={"n_pairs": "n_trials"}).reindex(columns=cols)
