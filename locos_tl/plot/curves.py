"""Ablation sweeps: metric against the number of ablated heads, and the dissociation
score ``DS(k)``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from locos_tl.plot._common import _check_columns, _color

_BASELINE_METHODS = ("none", "baseline")


def _seed_stats(df: pd.DataFrame, value: str) -> pd.DataFrame:
    """Mean and std over seeds of ``value`` at each (method, k)."""
    per_seed = df.groupby(["method", "k", "seed"], sort=False)[value].mean().reset_index()
    g = per_seed.groupby(["method", "k"], sort=False)[value]
    out = g.agg(["mean", "std", "count"]).reset_index()
    if "n_trials" in df.columns:
        nt = df.groupby(["method", "k"], sort=False)["n_trials"].max().reset_index()
        out = out.merge(nt, on=["method", "k"], how="left")
    else:
        out["n_trials"] = np.nan
    if {"ci_low", "ci_high"} <= set(df.columns):  # the seeds' intervals' envelope
        ci = df.groupby(["method", "k"], sort=False).agg(ci_low=("ci_low", "min"),
                                                         ci_high=("ci_high", "max"))
        out = out.merge(ci.reset_index(), on=["method", "k"], how="left")
    out["std"] = out["std"].fillna(0.0)
    order = {m: i for i, m in enumerate(dict.fromkeys(df["method"]))}
    return out.sort_values(["method", "k"], key=lambda c: c.map(order) if c.name == "method"
                           else c)


def _rgba(color: str, alpha: float) -> str:
    """``"#rrggbb"`` as ``"rgba(r, g, b, alpha)"``."""
    r, g, b = (int(color.lstrip("#")[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r}, {g}, {b}, {alpha})"


def ablation_curves(
    df: pd.DataFrame,
    *,
    metrics: Sequence[str] | None = None,
    log_x: bool = False,
    title: str | None = None,
) -> go.Figure:
    """Metric vs number of ablated heads ``k``, one line per method, one panel per metric.

    Methods with several seeds (the random-heads control) get error bars of one standard
    deviation over seeds. When ``df`` has interval columns ``ci_low``, ``ci_high`` (the
    bootstrap interval over trials of :func:`locos_tl.ablation_sweep`), every method's
    line gets a shaded band between them (for several seeds: from the lowest ``ci_low``
    to the highest ``ci_high`` of its seeds). The no-ablation row (method
    ``"baseline"``, ``k = 0``) is the first point of every line; controls (``random``,
    ``*_bottom``) are dotted.

    Args:
        df: tidy rows with columns ``method, k, seed, metric, value, n_trials``, as
            :func:`locos_tl.experiments.evaluate.ablation_sweep` returns (``value``: mean
            over trials; optional ``ci_low``, ``ci_high``).
        metrics: which metrics to draw, in order (default: all, in order of appearance).
        log_x: logarithmic k axis (the ``k = 0`` baseline is then a dashed line).
        title: figure title.

    Returns:
        A figure with one ``Scatter`` (lines+markers) per method and metric; with
        intervals, each is preceded by its band: a ``Scatter`` with ``fill="toself"``
        named ``"<method> interval"`` (no legend entry of its own, no hover).
    """
    _check_columns(df, ["method", "k", "seed", "metric", "value"])
    metrics = list(metrics) if metrics is not None else list(dict.fromkeys(df["metric"]))
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=metrics, shared_xaxes=True)
    is_base = df["method"].str.lower().isin(_BASELINE_METHODS)
    methods = list(dict.fromkeys(df.loc[~is_base, "method"]))
    for c, metric in enumerate(metrics, start=1):
        sub = df[df["metric"] == metric]
        stats = _seed_stats(sub, "value")
        base = stats[stats["method"].str.lower().isin(_BASELINE_METHODS)]
        for i, method in enumerate(methods):
            st = stats[stats["method"] == method]
            if st.empty:
                continue
            if not base.empty and not log_x and not (st["k"] == 0).any():
                st = pd.concat([base.assign(method=method), st])
            multi = bool((st["count"] > 1).any())
            control = method.lower() == "random" or method.lower().endswith("bottom")
            if "ci_low" in st.columns and st["ci_low"].notna().any():
                band = st.dropna(subset=["ci_low", "ci_high"])
                fig.add_trace(
                    go.Scatter(
                        x=[*band["k"], *band["k"][::-1]],
                        y=[*band["ci_high"], *band["ci_low"][::-1]],
                        mode="lines", fill="toself", name=f"{method} interval",
                        legendgroup=method, showlegend=False, hoverinfo="skip",
                        line={"width": 0}, fillcolor=_rgba(_color(method, i), 0.15),
                    ),
                    row=1, col=c,
                )
            fig.add_trace(
                go.Scatter(
                    x=st["k"], y=st["mean"], mode="lines+markers", name=method,
                    legendgroup=method, showlegend=c == 1,
                    line={"color": _color(method, i), "dash": "dot" if control else "solid"},
                    error_y={"type": "data", "array": st["std"], "visible": multi},
                    customdata=np.stack([st["std"], st["count"], st["n_trials"]], -1),
                    hovertemplate=f"{method}<br>k=%{{x}}<br>{metric}=%{{y:.3f}}"
                    + (" ± %{customdata[0]:.3f} (%{customdata[1]} seeds)" if multi else "")
                    + "<br>%{customdata[2]} trials<extra></extra>",
                ),
                row=1, col=c,
            )
        if log_x and not base.empty:
            fig.add_hline(y=float(base["mean"].mean()), line_dash="dash", line_color="black",
                          annotation_text="no ablation", annotation_position="bottom right",
                          row=1, col=c, exclude_empty_subplots=False)
        ks = sorted(int(k) for k in sub["k"].unique() if k > 0 or not log_x)
        fig.update_xaxes(title_text="k (heads ablated)", type="log" if log_x else None,
                         tickmode="array", tickvals=ks, row=1, col=c)
        fig.update_yaxes(title_text=metric, row=1, col=c)
    fig.update_layout(title=title or "ablating the top-k heads of each method",
                      hovermode="closest")
    return fig


def dissociation(df: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """Dissociation score ``DS(k)`` per method.

    ``DS(k) = (R0 - R(k)) / R0 - (P0 - P(k)) / P0`` (R: retrieval metric, P: control
    metric such as parametric recall or arithmetic, 0: no ablation; docs/concepts.md).
    Near 1: the heads are needed for retrieval only; near 0: the ablation hurts both
    alike, or neither. Unitless.

    Args:
        df: rows ``method, k, ds`` (and optionally ``seed``: then the mean over seeds is
            drawn with a one-std error bar), e.g.
            :func:`locos_tl.experiments.dissociation.dissociation_score`.
        title: figure title.

    Returns:
        A figure with one ``Scatter`` per method and a dotted line at ``DS = 0``.
    """
    _check_columns(df, ["method", "k", "ds"])
    if "seed" not in df.columns:
        df = df.assign(seed=0)
    stats = _seed_stats(df, "ds")
    fig = go.Figure()
    for i, method in enumerate(dict.fromkeys(df["method"])):
        st = stats[stats["method"] == method]
        multi = bool((st["count"] > 1).any())
        control = method.lower() == "random" or method.lower().endswith("bottom")
        fig.add_trace(
            go.Scatter(
                x=st["k"], y=st["mean"], mode="lines+markers", name=method,
                line={"color": _color(method, i), "dash": "dot" if control else "solid"},
                error_y={"type": "data", "array": st["std"], "visible": multi},
                customdata=np.stack([st["std"], st["count"]], -1),
                hovertemplate=f"{method}<br>k=%{{x}}<br>DS=%{{y:.3f}}"
                + (" ± %{customdata[0]:.3f} (%{customdata[1]} seeds)" if multi else "")
                + "<extra></extra>",
            )
        )
    fig.add_hline(y=0, line_dash="dot", line_color="grey")
    fig.update_layout(
        title=title or "dissociation DS(k): retrieval loss minus control loss",
        xaxis_title="k (heads ablated)", yaxis_title="DS(k)",
        xaxis={"tickmode": "array", "tickvals": sorted(int(k) for k in df["k"].unique())},
    )
    return fig
