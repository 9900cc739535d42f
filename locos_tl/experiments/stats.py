"""Intervals and paired tests over an ablation sweep's per-trial records: a percentile
bootstrap interval of a mean, McNemar's exact test on ``contains`` and Wilcoxon's
signed-rank test on the teacher-forced name margin. The paper protocol
(:mod:`locos_tl.experiments.protocol`) and :func:`locos_tl.ablation_sweep` use these."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
from scipy.stats import binomtest, wilcoxon

#: the columns :func:`paired_tests` needs (``load_evaluation(..., per_trial=True)``)
RECORD_COLUMNS = ("method", "k", "seed", "trial", "metric", "value")
PAIRED_COLUMNS = ["method", "against", "k", "n_pairs", "contains", "contains_against",
                  "n_only_a", "n_only_b", "p_mcnemar", "n_pairs_margin", "name_margin",
                  "name_margin_against", "p_wilcoxon"]


def bootstrap_ci(values: npt.ArrayLike, confidence: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (``scipy.stats.bootstrap``, 1000
    resamples, ``numpy.random.default_rng(seed)``: reproducible).

    Args:
        values: one value per trial (1-D).
        confidence: confidence level in (0, 1).
        seed: resampling seed.

    Returns:
        ``(low, high)`` in the values' units; both the mean when there are fewer than two
        values or they are all equal (NaN for none).
    """
    from scipy.stats import bootstrap

    values = np.asarray(values, dtype=float)
    if len(values) < 2 or np.all(values == values[0]):
        v = float(values.mean()) if len(values) else float("nan")
        return v, v
    res = bootstrap((values,), np.mean, n_resamples=1000, confidence_level=confidence,
                    method="percentile", random_state=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def _discordant(a: npt.ArrayLike, b: npt.ArrayLike) -> tuple[int, int]:
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    return int((a & ~b).sum()), int((~a & b).sum())


def mcnemar_p(a: npt.ArrayLike, b: npt.ArrayLike) -> float:
    """Two-sided exact McNemar p-value of paired 0/1 outcomes (binomial test on the
    discordant pairs; 1.0 when there are none)."""
    only_a, only_b = _discordant(a, b)
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


def _shared_ks(values: pd.DataFrame, a: str, b: str) -> list[int]:
    return sorted(set(values.loc[values["method"] == a, "k"])
                  & set(values.loc[values["method"] == b, "k"]))


def _pair_row(values: pd.DataFrame, a: str, b: str, k: int) -> dict[str, Any] | None:
    """The tests of ``a`` against ``b`` at ``k`` on their shared trials (None: none)."""
    x_all = _per_trial(values, a, k, "contains")
    y_all = _per_trial(values, b, k, "contains")
    common = x_all.index.intersection(y_all.index)
    if x_all.empty or y_all.empty or not len(common):
        return None
    x = x_all.loc[common].iloc[:, 0].to_numpy()
    # each of b's seeds tested alone; the largest p (and its discordant counts) reported
    tests = [(mcnemar_p(x, y_all.loc[common, s].to_numpy()),
              _discordant(x, y_all.loc[common, s].to_numpy())) for s in y_all.columns]
    p_mc, (only_a, only_b) = max(tests, key=lambda t: t[0])
    row = {"method": a, "against": b, "k": int(k), "n_pairs": len(common),
           "contains": float(x.mean()),
           "contains_against": float(y_all.loc[common].mean(axis=1).mean()),
           "n_only_a": only_a, "n_only_b": only_b, "p_mcnemar": p_mc,
           "n_pairs_margin": 0, "name_margin": np.nan, "name_margin_against": np.nan,
           "p_wilcoxon": np.nan}
    ma = _per_trial(values, a, k, "name_margin")
    mb = _per_trial(values, b, k, "name_margin")
    both = ma.index.intersection(mb.index).intersection(common)
    if len(both):
        u = ma.loc[both].iloc[:, 0].to_numpy()
        v = mb.loc[both].mean(axis=1).to_numpy()
        row.update(n_pairs_margin=len(both), name_margin=float(u.mean()),
                   name_margin_against=float(v.mean()), p_wilcoxon=wilcoxon_p(u, v))
    return row


def paired_tests(records: pd.DataFrame, a: str, b: str, *,
                 k: int | None = None) -> pd.DataFrame:
    """Paired tests of ranking ``a`` against ranking ``b`` of one ablation sweep, trial by
    trial: McNemar's exact test on ``contains`` and Wilcoxon's signed-rank test on the
    teacher-forced name margin.

    McNemar: a two-sided exact binomial test (``scipy.stats.binomtest``, p = 0.5) on the
    discordant pairs (trials that only one of the two answers correctly); p = 1 when
    there are none. Wilcoxon: ``scipy.stats.wilcoxon`` on the per-trial margin
    differences (two-sided; p = 1 when every pair ties). Where ``b`` has several seeds
    (the random-heads control), McNemar tests each seed alone and reports the largest p
    (with that seed's discordant counts); Wilcoxon and ``*_against`` means use ``b``'s
    seeds averaged per trial. ``a`` is taken at its lowest seed (rankings are
    deterministic: pass the random control as ``b``). These are the paper protocol's
    tests (``paired.csv``; :mod:`locos_tl.experiments.protocol.paired`).

    Args:
        records: per-trial scores, columns ``method, k, seed, trial, metric, value``
            (:func:`locos_tl.load_evaluation` with ``per_trial=True``); metrics
            ``contains`` (0/1) and, optionally, ``name_margin`` (nats).
        a: a method (ranking) name in ``records``, e.g. ``"locos"``.
        b: the method it is tested against, e.g. ``"random"``.
        k: one head count; default: every k both methods have.

    Returns:
        One row per k, columns ``method`` (a), ``against`` (b), ``k``, ``n_pairs``
        (trials both have), ``contains`` and ``contains_against`` (means, fraction of
        answers naming the target), ``n_only_a`` and ``n_only_b`` (discordant pairs:
        trials only a, or only b, answers correctly), ``p_mcnemar``,
        ``n_pairs_margin``, ``name_margin`` and ``name_margin_against`` (means, nats),
        ``p_wilcoxon`` (NaN, with ``n_pairs_margin = 0``, where the records hold no name
        margin).

    Raises:
        ValueError: ``records`` lacks a column; ``a`` or ``b`` is not a method in it;
            ``k`` is not a head count both have; or they share no k or no trial with a
            ``contains`` score.

    Example:
        >>> recs = load_evaluation("runs/ablate", trials, per_trial=True)  # doctest: +SKIP
        >>> paired_tests(recs, "locos", "random", k=5)  # doctest: +SKIP
    """
    missing = [c for c in RECORD_COLUMNS if c not in records.columns]
    if missing:
        raise ValueError(f"paired_tests: records lack column(s) {missing}; pass per-trial "
                         "records (load_evaluation(..., per_trial=True))")
    methods = set(records["method"])
    for name in (a, b):
        if name not in methods:
            raise ValueError(f"paired_tests: method {name!r} is not in the records "
                             f"(methods: {sorted(methods)})")
    ks = _shared_ks(records, a, b)
    if k is not None:
        if int(k) not in ks:
            raise ValueError(f"paired_tests: k={k} is not a head count both {a!r} and "
                             f"{b!r} have (shared: {ks})")
        ks = [int(k)]
    rows = [r for kk in ks if (r := _pair_row(records, a, b, kk)) is not None]
    if not rows:
        raise ValueError(f"paired_tests: {a!r} and {b!r} share no k with a 'contains' "
                         "score on a common trial: no pairs")
    return pd.DataFrame(rows, columns=PAIRED_COLUMNS)
