"""Intervals and paired tests over an ablation sweep's per-trial records: a percentile
bootstrap interval of a mean, McNemar's exact test on ``contains`` and Wilcoxon's
signed-rank test on the teacher-forced name margin. The paper protocol
(:mod:`locos_tl.experiments.protocol`) and :func:`locos_tl.ablation_sweep` use these.
:func:`check_confidence` is the one check of a confidence level every public function
taking one applies. scipy is imported when a test runs, not with this module."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from locos_tl.head_spec import check_confidence

#: the columns :func:`paired_tests` needs (``load_ablation_sweep(..., per_trial=True)``)
RECORD_COLUMNS = ("method", "k", "seed", "trial", "metric", "value")
#: what identifies one record: a sweep holds each at most once
RECORD_KEY = ["trial", "method", "k", "seed", "metric"]
PAIRED_COLUMNS = ["method", "against", "k", "n_pairs", "contains", "contains_against",
                  "n_only_a", "n_only_b", "p_mcnemar", "n_pairs_margin", "name_margin",
                  "name_margin_against", "p_wilcoxon"]


def bootstrap_ci(values: npt.ArrayLike, confidence: float | int = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (``scipy.stats.bootstrap``, 1000
    resamples, ``numpy.random.default_rng(seed)``: reproducible).

    Args:
        values: one value per trial (1-D).
        confidence: confidence level in (0, 1), e.g. 0.95.
        seed: resampling seed.

    Returns:
        ``(low, high)`` in the values' units; both the mean when there are fewer than two
        values or they are all equal (NaN for none).

    Raises:
        ValueError: ``confidence`` is not a level in (0, 1) (:func:`check_confidence`).
    """
    from scipy.stats import bootstrap

    confidence = check_confidence(confidence)
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
    from scipy.stats import binomtest

    only_a, only_b = _discordant(a, b)
    if only_a + only_b == 0:
        return 1.0
    return float(binomtest(only_a, only_a + only_b, 0.5).pvalue)


def wilcoxon_p(a: npt.ArrayLike, b: npt.ArrayLike) -> float:
    """Two-sided Wilcoxon signed-rank p-value of paired values (1.0 when every pair
    ties)."""
    from scipy.stats import wilcoxon

    d = np.asarray(a, float) - np.asarray(b, float)
    if not np.any(d != 0):
        return 1.0
    return float(wilcoxon(d).pvalue)


def _some(items: Collection[Any], n: int = 3) -> str:
    """The first ``n`` of ``items`` for a message, and how many more there are."""
    items = list(items)
    more = f", ... ({len(items) - n} more)" if len(items) > n else ""
    return ", ".join(map(str, items[:n])) + more


def check_records(records: pd.DataFrame, methods: Collection[str]) -> None:
    """Refuse per-trial records of ``methods`` that :func:`paired_tests` cannot pair.

    Raises:
        ValueError: a (trial, method, k, seed, metric) occurs in more than one row (the
            records of two sweeps concatenated: a resumed run and its first half, two
            runs of one seed), or a ``contains`` value is not 0 or 1 (NaN, 0.5: a mean,
            not one answer); the message gives the count and the first rows.
    """
    sel = records[records["method"].isin(list(methods))]
    dup = sel[sel.duplicated(RECORD_KEY, keep=False)]
    if len(dup):
        keys = dup.groupby(RECORD_KEY, sort=False).size()
        shown = [f"(trial {t!r}, method {m!r}, k {k}, seed {s}, metric {x!r}) x{n}"
                 for (t, m, k, s, x), n in keys.items()]
        raise ValueError(
            f"paired_tests: {len(keys)} (trial, method, k, seed, metric) record(s) occur "
            f"in more than one row ({len(dup)} rows): {_some(shown)}. A sweep holds one "
            "record per trial and cell: were the records of two sweeps concatenated (a "
            "resumed run and its first half, two runs of one seed)? Keep one of each")
    bad = sel[(sel["metric"] == "contains") & ~sel["value"].isin([0, 1])]
    if len(bad):
        shown = [f"(trial {r.trial!r}, method {r.method!r}, k {r.k}, seed {r.seed}) "
                 f"{r.value}" for r in bad.itertuples()]
        raise ValueError(
            f"paired_tests: {len(bad)} 'contains' record(s) are not 0 or 1: "
            f"{_some(shown)}. 'contains' is whether one answer names the target; pass "
            "one record per trial, not a mean")


def _per_trial(values: pd.DataFrame, method: str, k: int, metric: str) -> pd.DataFrame:
    """A cell's per-trial values: one row per trial (sorted by id), one column per seed
    (ascending); NaN where a seed lacks the trial. Records checked by
    :func:`check_records` (one per trial, method, k, seed and metric)."""
    sel = values[(values["method"] == method) & (values["k"] == k)
                 & (values["metric"] == metric)]
    return sel.pivot(index="trial", columns="seed", values="value").sort_index(axis=1)


def _check_same_trials(cols: dict[tuple[str, Any], pd.Index], a: str, b: str, k: int,
                       metric: str, every: pd.Index | None = None) -> None:
    """Refuse ``metric`` records of (method, seed) -> trial ids that are not all
    ``every`` (default: every trial one of them has)."""
    every = sorted(set().union(*(set(ix) for ix in cols.values())) if every is None
                   else every)
    gaps = [(m, s, [t for t in every if t not in set(ix)]) for (m, s), ix in cols.items()]
    gaps = [g for g in gaps if g[2]]
    if gaps:
        what = "; ".join(f"{m!r} seed {s} lacks {len(miss)} ({_some(miss)})"
                         for m, s, miss in gaps)
        raise ValueError(
            f"paired_tests: at k={k} the {metric!r} records of {a!r} and {b!r} are not "
            f"over the same trials: {what}. Pair sweeps over one trial list "
            "(load_ablation_sweep keeps the cells complete on the trials it is given), or "
            "select the trials both hold yourself")


def _seed_mean(y: pd.DataFrame) -> np.ndarray:
    """Per-trial (row) mean over seeds (columns), exactly the seeds' value where they all
    agree: ``(u + u + u) / 3`` rounds away from ``u`` for some ``u`` (``0.1 + 0.2``),
    which would turn a tie with that ``u`` into a difference."""
    v = y.to_numpy(dtype=float)
    return np.where((v == v[:, :1]).all(axis=1), v[:, 0], y.mean(axis=1).to_numpy())


def _shared_ks(values: pd.DataFrame, a: str, b: str) -> list[int]:
    return sorted(set(values.loc[values["method"] == a, "k"])
                  & set(values.loc[values["method"] == b, "k"]))


def _pair_row(values: pd.DataFrame, a: str, b: str, k: int) -> dict[str, Any] | None:
    """The tests of ``a`` (its lowest seed) against ``b`` (every seed) at ``k``, trial by
    trial (None: either has no ``contains`` at ``k``). Records checked by
    :func:`check_records`.

    Raises:
        ValueError: the two are not over the same trials at ``k`` (nor ``b``'s seeds),
            in ``contains`` or, where both have one, ``name_margin``.
    """
    x_all = _per_trial(values, a, k, "contains")
    y_all = _per_trial(values, b, k, "contains")
    if x_all.empty or y_all.empty:
        return None
    seed_a, seeds_b = x_all.columns[0], list(y_all.columns)
    x_s = x_all[seed_a].dropna()
    _check_same_trials({(a, seed_a): x_s.index, **{(b, s): y_all[s].dropna().index
                                                 for s in seeds_b}}, a, b, k, "contains")
    trials, x = x_s.index, x_s.to_numpy()
    y = y_all.loc[trials]
    # each of b's seeds tested alone; the largest p (and its discordant counts) reported
    tests = [(mcnemar_p(x, y[s].to_numpy()), _discordant(x, y[s].to_numpy()))
             for s in seeds_b]
    p_mc, (only_a, only_b) = max(tests, key=lambda t: t[0])
    row = {"method": a, "against": b, "k": int(k), "n_pairs": len(trials),
           "contains": float(x.mean()), "contains_against": float(y.mean(axis=1).mean()),
           "n_only_a": only_a, "n_only_b": only_b, "p_mcnemar": p_mc,
           "n_pairs_margin": 0, "name_margin": np.nan, "name_margin_against": np.nan,
           "p_wilcoxon": np.nan}
    ma = _per_trial(values, a, k, "name_margin")
    mb = _per_trial(values, b, k, "name_margin")
    if ma.empty or mb.empty:  # records without the teacher-forced margin
        return row
    none = pd.Index([])
    _check_same_trials({(a, seed_a): ma[seed_a].dropna().index if seed_a in ma else none,
                        **{(b, s): mb[s].dropna().index if s in mb else none
                           for s in seeds_b}}, a, b, k, "name_margin", trials)
    u = ma.loc[trials, seed_a].to_numpy()
    v = _seed_mean(mb.loc[trials, seeds_b])
    row.update(n_pairs_margin=len(trials), name_margin=float(u.mean()),
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
    seeds averaged per trial, where the seeds agree exactly their common value (the
    floating-point mean of equal values can differ from them in the last bit, and a
    ranking tested against seeds equal to itself then gets p = 1, not a spurious
    difference). ``a`` is taken at its lowest seed (rankings are deterministic: pass the
    random control as ``b``). These are the paper protocol's tests (``paired.csv``;
    :mod:`locos_tl.experiments.protocol.paired`).

    Trials are paired by id: at each k, ``a`` and every seed of ``b`` must hold the
    same trials (in ``contains``, and in ``name_margin`` where both have one), and each
    (trial, method, k, seed, metric) one record. Nothing is averaged or dropped to make
    records fit: concatenated sweeps (two records per trial) and sweeps over different
    trials are refused.

    Args:
        records: per-trial scores, columns ``method, k, seed, trial, metric, value``
            (:func:`locos_tl.load_ablation_sweep` with ``per_trial=True``), one row per
            (trial, method, k, seed, metric); metrics ``contains`` (0 or 1) and,
            optionally, ``name_margin`` (nats).
        a: a method (ranking) name in ``records``, e.g. ``"locos"``.
        b: the method it is tested against, e.g. ``"random"``.
        k: one head count; default: every k both methods have.

    Returns:
        One row per k, columns ``method`` (a), ``against`` (b), ``k``, ``n_pairs``
        (trials), ``contains`` and ``contains_against`` (means, fraction of
        answers naming the target), ``n_only_a`` and ``n_only_b`` (discordant pairs:
        trials only a, or only b, answers correctly), ``p_mcnemar``,
        ``n_pairs_margin``, ``name_margin`` and ``name_margin_against`` (means, nats),
        ``p_wilcoxon`` (NaN, with ``n_pairs_margin = 0``, where the records hold no name
        margin).

    Raises:
        ValueError: ``records`` lacks a column; ``a`` or ``b`` is not a method in it;
            ``k`` is not a head count both have; they share no k with a ``contains``
            score; a (trial, method, k, seed, metric) of ``a`` or ``b`` is in more than
            one row, or a ``contains`` is not 0 or 1 (the message names the first rows
            and counts them); at a k, ``a`` and ``b`` (or ``b``'s seeds) are not over
            the same trials (the message names the trials each lacks).

    Example:
        >>> recs = load_ablation_sweep("runs/ablate", trials, per_trial=True)  # doctest: +SKIP
        >>> paired_tests(recs, "locos", "random", k=5)  # doctest: +SKIP
    """
    missing = [c for c in RECORD_COLUMNS if c not in records.columns]
    if missing:
        raise ValueError(f"paired_tests: records lack column(s) {missing}; pass per-trial "
                         "records (load_ablation_sweep(..., per_trial=True))")
    methods = set(records["method"])
    for name in (a, b):
        if name not in methods:
            raise ValueError(f"paired_tests: method {name!r} is not in the records "
                             f"(methods: {sorted(methods)})")
    check_records(records, (a, b))
    ks = _shared_ks(records, a, b)
    if k is not None:
        if int(k) not in ks:
            raise ValueError(f"paired_tests: k={k} is not a head count both {a!r} and "
                             f"{b!r} have (shared: {ks})")
        ks = [int(k)]
    rows = [r for kk in ks if (r := _pair_row(records, a, b, kk)) is not None]
    if not rows:
        raise ValueError(f"paired_tests: {a!r} and {b!r} share no k with a 'contains' "
                         "score: no pairs")
    return pd.DataFrame(rows, columns=PAIRED_COLUMNS)
