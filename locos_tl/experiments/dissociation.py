"""Tables over an ablation sweep's results: the mean per (method, k, metric), and the
dissociation score DS(k) between retrieval and a control task (arXiv 2607.01002, Sec. 4).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from locos_tl.experiments.task_metrics import DEFAULT_CONTROL_METRIC

__all__ = ["BASELINE", "dissociation_score", "summarize"]

#: the method name of the unablated (k = 0) row of an ablation sweep's table
BASELINE = "baseline"


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Mean (and std over seeds) of ``value`` per ``(method, k, metric)``."""
    g = df.groupby(["method", "k", "metric"], as_index=False)["value"]
    out = g.agg(value="mean", std="std", n_seeds="count")
    return out.sort_values(["metric", "method", "k"]).reset_index(drop=True)


def dissociation_score(
    df_retrieval: pd.DataFrame,
    df_control: pd.DataFrame,
    *,
    retrieval_metric: str = "rougeL",
    control_metric: str = DEFAULT_CONTROL_METRIC,
) -> pd.DataFrame:
    """Dissociation score ``DS(k) = (R0 - R(k)) / R0 - (P0 - P(k)) / P0`` (docs/concepts.md).

    ``R``: retrieval metric, ``P``: control metric (parametric recall or arithmetic),
    index 0: no ablation (the ``"baseline"`` row). Values are first averaged over
    seeds. DS near 1: the heads are needed for retrieval only; near 0: the ablation
    hurts both alike (or neither). Unitless. Source: arXiv 2607.01002, Sec. 4; the
    control metric defaults to the authors' exact match after lower-casing and
    stripping (``scorer="control"`` rows ``exact_match``); ``"contains"`` (NoLiMa's
    case-sensitive substring, the former default) is the option.

    Args:
        df_retrieval, df_control: :func:`evaluate` outputs on retrieval and control trials
            (same head sets and k); control trials scored with ``scorer="control"``
            (trials from :mod:`locos_tl.data.controls`).
        retrieval_metric, control_metric: the ``metric`` rows to use.

    Returns:
        One row per ``(method, k)`` present in both: ``R0, R, P0, P, ds`` (NaN when a
        baseline is 0).

    Raises:
        ValueError: a column, a metric or a baseline row is missing.
    """
    def pick(df: pd.DataFrame, metric: str, what: str) -> tuple[float, pd.Series]:
        missing = [c for c in ("method", "k", "metric", "value") if c not in df.columns]
        if missing:
            raise ValueError(f"{what}: not an ablation_sweep() table (no column {missing})")
        sub = df[df["metric"] == metric]
        if sub.empty:
            raise ValueError(f"{what}: no rows for metric {metric!r} "
                             f"(have {sorted(df['metric'].unique())})")
        base = sub[sub["method"] == BASELINE]["value"]
        if base.empty:
            raise ValueError(f"{what}: no {BASELINE!r} (k=0) row")
        means = sub[sub["method"] != BASELINE].groupby(["method", "k"])["value"].mean()
        return float(base.mean()), means

    R0, R = pick(df_retrieval, retrieval_metric, "retrieval")
    P0, P = pick(df_control, control_metric, "control")
    both = R.index.intersection(P.index)
    out = pd.DataFrame({"R0": R0, "R": R.loc[both], "P0": P0, "P": P.loc[both]})
    with np.errstate(divide="ignore", invalid="ignore"):
        r_drop = (out["R0"] - out["R"]) / out["R0"] if R0 != 0 else np.nan
        p_drop = (out["P0"] - out["P"]) / out["P0"] if P0 != 0 else np.nan
    out["ds"] = r_drop - p_drop
    return out.reset_index()
