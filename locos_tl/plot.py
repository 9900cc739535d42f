"""Plotly figures of head scores (one figure a function; each returns a ``Figure``)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from locos_tl.heads import HeadScores


def head_heatmap(scores: HeadScores, *, title: str | None = None) -> go.Figure:
    """Layer x head heatmap of ``scores.scores`` (RdBu, centred at 0).

    Hover shows ``L{l}H{h}``, the score and its bootstrap 95 % CI.
    """
    s = scores.scores.numpy()
    low, high = (t.numpy() for t in scores.ci)
    L, H = s.shape
    labels = np.array([[f"L{l}H{h}" for h in range(H)] for l in range(L)])
    custom = np.stack([labels, low.round(4).astype(str), high.round(4).astype(str)], -1)
    vmax = float(np.nanmax(np.abs(s))) if np.isfinite(s).any() else 1.0
    fig = go.Figure(
        go.Heatmap(
            z=s,
            x=list(range(H)),
            y=list(range(L)),
            customdata=custom,
            colorscale="RdBu",
            zmid=0,
            zmin=-vmax,
            zmax=vmax,
            colorbar={"title": scores.method},
            hovertemplate="%{customdata[0]}<br>score=%{z:.4f}"
            "<br>95% CI [%{customdata[1]}, %{customdata[2]}]<extra></extra>",
        )
    )
    fig.update_layout(
        title=title or f"{scores.method} head scores ({scores.n_trials} trials)",
        xaxis_title="Head",
        yaxis_title="Layer",
        yaxis_autorange="reversed",
    )
    return fig
