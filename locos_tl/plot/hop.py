"""Where a hop is computed: cross-model MLP patching by layer, and one head's attention
score split into upstream components (docs/concepts.md, "Where a hop is computed")."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from locos_tl.plot._common import _FALLBACK, _check_columns, _fmt

_SIDE_COLORS = {"query": "#1f77b4", "key": "#ff7f0e"}


def mlp_patching_curves(summary: pd.DataFrame, *, metric: str = "margin",
                        title: str | None = None) -> go.Figure:
    """Name margin (or the target's log-probability) of the base with the donor's MLP
    writes patched in, by layer, one line per position set, with the unpatched base and
    donor as dashed lines.

    Args:
        summary: ``summarize_mlp_patching(mlp_patching(...))``
            (:mod:`locos_tl.experiments.cross_model`): columns ``positions``, ``layer``
            (an int, or ``"all"``: every layer at once), ``n_trials``, and for the
            metric ``m``: ``m``, ``m_low``, ``m_high``, ``base_m``, ``donor_m``.
        metric: ``"margin"`` (name margin, nats) or ``"target_logprob"`` (log-probability
            of the target's name, nats).
        title: figure title.

    Returns:
        One ``Scatter`` a position set (mean in nats, bootstrap interval as error bars;
        the x axis: layers, then ``"all"``), then two dashed ones, ``"base"`` and
        ``"donor"``: the unpatched models on each point's trials.

    Raises:
        ValueError: an unknown metric, a column is missing, or the table is empty.
    """
    units = {"margin": "name margin (nats)", "target_logprob": "log P(target name) (nats)"}
    if metric not in units:
        raise ValueError(f"metric must be one of {sorted(units)}, not {metric!r}")
    _check_columns(summary, ["positions", "layer", metric, f"{metric}_low", f"{metric}_high",
                             f"base_{metric}", f"donor_{metric}", "n_trials"])
    if summary.empty:
        raise ValueError("no rows to plot")
    ints = sorted({int(x) for x in summary["layer"] if x != "all"})
    order = [str(x) for x in ints] + (["all"] if (summary["layer"] == "all").any() else [])
    fig = go.Figure()
    for i, (pos, g) in enumerate(summary.groupby("positions", sort=False)):
        g = g.assign(x=g["layer"].astype(str)).set_index("x").reindex(
            [x for x in order if x in set(g["layer"].astype(str))])
        m = g[metric].to_numpy(float)
        fig.add_trace(go.Scatter(
            x=list(g.index), y=m, mode="lines+markers", name=str(pos),
            line={"color": _FALLBACK[i % len(_FALLBACK)]},
            error_y={"type": "data", "symmetric": False,
                     "array": g[f"{metric}_high"].to_numpy(float) - m,
                     "arrayminus": m - g[f"{metric}_low"].to_numpy(float)},
            customdata=g["n_trials"].to_numpy(),
            hovertemplate=f"{pos}, layer %{{x}}: {metric} %{{y:.3g}} nats "
            "(%{customdata} trials)<extra></extra>"))
    # the unpatched models on each point's own trials (the per-layer sweep may run on
    # fewer trials than the all-layers patch)
    ref = summary.assign(x=summary["layer"].astype(str)).groupby("x", sort=False)[
        [f"base_{metric}", f"donor_{metric}"]].mean().reindex(order)
    for what, dash in (("base", "dash"), ("donor", "dot")):
        fig.add_trace(go.Scatter(
            x=order, y=ref[f"{what}_{metric}"].to_numpy(float), mode="lines", name=what,
            line={"color": "#555", "dash": dash},
            hovertemplate=f"{what}, layer %{{x}}: %{{y:.3g}} nats<extra></extra>"))
    fig.update_xaxes(title_text="layer patched", type="category", categoryorder="array",
                     categoryarray=order)
    fig.update_yaxes(title_text=units[metric])
    fig.update_layout(title=title or "base with the donor's MLP writes", legend_title="positions")
    return fig


def score_attribution_bars(df: pd.DataFrame, head: str | None = None, *,
                           title: str | None = None) -> go.Figure:
    """One head's attention score from the answer position to the needle, split into the
    contributions of upstream components on the query side and on the key side.

    Contributions are summed over the key positions of each trial, then averaged over
    trials (attention logits); the title gives the mean exact score summed the same way.

    Args:
        df: ``score_attribution(...)`` (:mod:`locos_tl.experiments.score_attribution`):
            columns ``trial_id``, ``label``, ``key_pos``, ``side``, ``component``,
            ``contribution``, ``exact_score``.
        head: the head's label (``"L5H2"``); default the first in ``df``.
        title: figure title.

    Returns:
        Two ``Bar`` traces (``query``, ``key``), x = component in the table's order.

    Raises:
        ValueError: a column is missing, or ``head`` is not in ``df``.
    """
    _check_columns(df, ["trial_id", "label", "key_pos", "side", "component", "contribution",
                        "exact_score"])
    labels = list(dict.fromkeys(df["label"]))
    head = labels[0] if head is None and labels else head
    sel = df[df["label"] == head]
    if sel.empty:
        raise ValueError(f"head {head!r} is not in the table (heads: {labels[:8]})")
    per_trial = sel.groupby(["side", "component", "trial_id"], sort=False)["contribution"].sum()
    mean = per_trial.groupby(["side", "component"], sort=False).mean()
    first = sel[sel["side"] == sel["side"].iloc[0]].drop_duplicates(["trial_id", "key_pos"])
    exact = float(first.groupby("trial_id")["exact_score"].sum().mean())
    components = list(dict.fromkeys(sel["component"]))
    fig = go.Figure()
    for side in dict.fromkeys(sel["side"]):
        y = np.array([float(mean.get((side, c), np.nan)) for c in components])
        fig.add_trace(go.Bar(x=components, y=y, name=f"{side} side",
                             marker_color=_SIDE_COLORS.get(side, "#7f7f7f"),
                             hovertemplate=f"{side} side, %{{x}}: %{{y:.4g}}<extra></extra>"))
    fig.update_xaxes(title_text="component")
    fig.update_yaxes(title_text="contribution to the attention score (logits)")
    fig.update_layout(barmode="group", title=title or
                      f"{head}: score to the needle {_fmt(exact)} (sum over keys, mean over "
                      f"{sel['trial_id'].nunique()} trials)")
    return fig
