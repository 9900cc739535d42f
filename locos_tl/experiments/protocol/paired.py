"""Paired tests between the ablation grid's rankings, on the same trials: McNemar's exact
test on ``contains`` and Wilcoxon's signed-rank test on the teacher-forced name margin
(:mod:`locos_tl.experiments.protocol`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pandas as pd
from scipy.stats import binomtest, wilcoxon

#: (ranking, against) pairs tested at every k both have; "random" pools its seeds
PAIRS: tuple[tuple[str, str], ...] = (
    ("locos", "random"), ("wu_nolima", "random"), ("wu_niah", "random"), ("dla", "random"),
    ("attention_spatial", "random"), ("headkv", "random"),
    ("locos", "wu_nolima"), ("locos", "wu_niah"), ("locos", "dla"),
)


def mcnemar_p(a: npt.ArrayLike, b: npt.ArrayLike) -> float:
    """Two-sided exact McNemar p-value of paired 0/1 outcomes (binomial test on the
    discordant pairs; 1.0 when there are none)."""
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    if only_a + only_b == 0:
        return 1.0
    return float(binomtest(only_a, only_a + only_b, 0.5).pvalue)


def wilcoxon_p(a: npt.ArrayLike, b: npt.ArrayLike) -> float:
    """Two-sided Wilcoxon signed-rank p-value of paired values (1.0 when every pair
    ties)."""
    d = np.asarray(a, float) - np.asarray(b, float)
    if not np.any(d != 0):
        return 1.0
    return float(wilcoxon(d).pvalue)


def _per_trial(values: pd.DataFrame, method: str, k: int, metric: str) -> pd.DataFrame:
    """A cell's per-trial values: one row per trial, one column per seed."""
    sel = values[(values["method"] == method) & (values["k"] == k)
                 & (values["metric"] == metric)]
    return sel.pivot_table(index="trial", columns="seed", values="value")


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
    """
    rows = []
    for method, against in pairs:
        ks = sorted(set(values.loc[values["method"] == method, "k"])
                    & set(values.loc[values["method"] == against, "k"]))
        for k in ks:
            a = _per_trial(values, method, k, "contains")
            b = _per_trial(values, against, k, "contains")
            common = a.index.intersection(b.index)
            if a.empty or b.empty or not len(common):
                continue
            x = a.loc[common].iloc[:, 0].to_numpy()
            p_mc = max(mcnemar_p(x, b.loc[common, s].to_numpy()) for s in b.columns)
            row = {"method": method, "against": against, "k": int(k),
                   "n_trials": len(common), "contains": float(x.mean()),
                   "contains_against": float(b.loc[common].mean(axis=1).mean()),
                   "p_mcnemar": p_mc, "name_margin": np.nan,
                   "name_margin_against": np.nan, "p_wilcoxon": np.nan}
            ma = _per_trial(values, method, k, "name_margin")
            mb = _per_trial(values, against, k, "name_margin")
            both = ma.index.intersection(mb.index).intersection(common)
            if len(both):
                u = ma.loc[both].iloc[:, 0].to_numpy()
                v = mb.loc[both].mean(axis=1).to_numpy()
                row.update(name_margin=float(u.mean()), name_margin_against=float(v.mean()),
                           p_wilcoxon=wilcoxon_p(u, v))
            rows.append(row)
    return pd.DataFrame(rows, columns=["method", "against", "k", "n_trials", "contains",
                                       "contains_against", "p_mcnemar", "name_margin",
                                       "name_margin_against", "p_wilcoxon"])
