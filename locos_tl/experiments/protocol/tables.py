"""The protocol's tables: per-trial values, bootstrap intervals, the headline table and
compression accuracy (:mod:`locos_tl.experiments.protocol`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from locos_tl.experiments.protocol.common import _bootstrap


def trial_values(run: Path, trials: list[Any], scorer: str,
                 keys: dict[tuple[str, int, int], str]) -> pd.DataFrame:
    """Every complete job's per-trial scores, from the run's records: one row per (job,
    trial, metric), columns ``method``, ``k``, ``seed``, ``heads_key``, ``trial``,
    ``metric``, ``value``, in ``keys``' order and the records' order within a job.

    ``keys``: (method, k, seed) -> head-set key
    (:func:`locos_tl.experiments.protocol.stages.job_keys`). A job whose records miss a
    trial of ``trials`` is left out (a sweep still running, or a grid that a
    later call grew); the records hold every finished generation, so sweeps run on
    different grids (a ragged grid) report together.
    """
    from locos_tl.experiments.run_table import score_records

    per = score_records(run, trials, scorer)
    n = len({t.trial_id for t in trials})
    parts = [per[per["heads_key"] == key].assign(method=method, k=k, seed=seed)
             for (method, k, seed), key in keys.items()]
    parts = [sub for sub in parts if sub["trial"].nunique() == n]
    cols = ["method", "k", "seed", "heads_key", "trial", "metric", "value"]
    if not parts:
        return pd.DataFrame(columns=cols)
    return pd.concat(parts, ignore_index=True)[cols]


def interval_table(values: pd.DataFrame) -> pd.DataFrame:
    """One row per (method, k, seed, metric) of :func:`trial_values`: the mean over
    trials (as ``evaluate`` computes it) and a bootstrap 95 % interval over trials."""
    rows = []
    for (method, k, seed), job in values.groupby(["method", "k", "seed"], sort=False):
        for metric, g in job.groupby("metric", sort=False):
            v = g["value"].to_numpy(dtype=float)
            lo, hi = _bootstrap(v)
            rows.append({"method": method, "k": int(k), "seed": int(seed), "metric": metric,
                         "value": float(v.mean()), "n_trials": len(v),
                         "ci_low": lo, "ci_high": hi})
    return pd.DataFrame(rows, columns=["method", "k", "seed", "metric", "value",
                                       "n_trials", "ci_low", "ci_high"])


def evaluation_table(run: Path, trials: list[Any], scorer: str,
                     keys: dict[tuple[str, int, int], str]) -> pd.DataFrame:
    """The sweep's table (``evaluation_ci.csv``), rebuilt from the run's records: one
    row per complete job and metric of ``keys`` ((method, k, seed) -> head-set key,
    :func:`locos_tl.experiments.protocol.stages.job_keys`), with a bootstrap 95 %
    interval over trials (:func:`trial_values`, :func:`interval_table`). The runs
    published so far predate ``jobs.json`` (:func:`locos_tl.load_evaluation`), so the
    cells come from the grid the report is given. ``value`` is the mean over trials, as
    ``evaluate`` computes it.
    """
    return interval_table(trial_values(run, trials, scorer, keys))


def compression_accuracy(df: pd.DataFrame) -> pd.DataFrame:
    """Answer accuracy ("contains") per ranking x fraction x task, with the number of
    trials and a 95 % bootstrap interval over trials."""
    rows = []
    for (ranking, frac, task), sel in df.groupby(["ranking", "fraction", "task"]):
        v = sel["answer_correct"].astype(float).to_numpy()
        lo, hi = _bootstrap(v)
        rows.append({"ranking": ranking, "fraction": frac, "task": task,
                     "n_trials": len(v), "accuracy": float(v.mean()),
                     "ci_low": lo, "ci_high": hi})
    return pd.DataFrame(rows)


def headline(tables: dict[tuple[str, int], pd.DataFrame], k_head: int,
             values: dict[tuple[str, int], pd.DataFrame] | None = None) -> pd.DataFrame:
    """Baseline / LOCOS / Wu (NIAH, NoLiMa) / attention-spatial / random at ``k_head``,
    per question type and length, beside the paper's Qwen3-8B numbers (ROUGE-L F,
    non-literal NoLiMa). ``tables``: (question, length) -> :func:`evaluation_table`.
    Where a table has no LOCOS cell at ``k_head`` (a smaller grid, e.g. one k at 2000
    tokens), its row is at the largest k below it that LOCOS has.

    Random is the mean over the seeds run. Its interval is a bootstrap over trials of
    each trial's mean over the seeds, from ``values`` ((question, length) ->
    :func:`trial_values`); without them, or when a seed lacks a trial, the interval is
    left empty (NaN), since averaging the seeds' own intervals gives no interval."""
    paper = {"baseline": 0.40, "locos": 0.00, "wu_niah": 0.29, "wu": 0.34,
             "random": 0.40, "attention_spatial": 0.15}
    rows = []
    for (qtype, length), ev in tables.items():
        run_ks = ev.loc[(ev["method"] == "locos") & (ev["k"] <= k_head), "k"]
        k_at = int(run_ks.max()) if len(run_ks) else k_head
        for method, ref in paper.items():
            k = 0 if method == "baseline" else k_at
            sel = ev[(ev["metric"] == "rougeL") & (ev["method"] == method) & (ev["k"] == k)]
            if sel.empty:
                continue
            lo, hi = sel["ci_low"].iloc[0], sel["ci_high"].iloc[0]
            if len(sel) > 1:  # seeds: pool them per trial
                lo = hi = np.nan
                vals = (values or {}).get((qtype, length))
                if vals is not None:
                    v = vals[(vals["metric"] == "rougeL") & (vals["method"] == method)
                             & (vals["k"] == k)]
                    by_trial = v.pivot_table(index="trial", columns="seed", values="value")
                    if sorted(by_trial.columns) == sorted(sel["seed"]) \
                            and not by_trial.isna().any().any():
                        lo, hi = _bootstrap(by_trial.mean(axis=1).to_numpy())
            rows.append({"question": qtype, "length": length, "method": method, "k": k,
                         "rougeL": sel["value"].mean(), "ci_low": lo, "ci_high": hi,
                         "n_seeds": len(sel), "n_trials": int(sel["n_trials"].iloc[0]),
                         "paper_qwen3_8b": ref if qtype == "onehop" else np.nan})
    return pd.DataFrame(rows)
