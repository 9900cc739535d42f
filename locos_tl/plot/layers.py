"""Where the top-k heads sit: by layer, and by normalised depth."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from locos_tl.head_spec import as_int
from locos_tl.heads import HeadScores, head_label
from locos_tl.plot._common import _as_list, _color


def layer_distribution(
    scores: HeadScores | Sequence[HeadScores],
    k: int,
    *,
    n_bins: int = 10,
    title: str | None = None,
) -> go.Figure:
    """Where the top-``k`` heads sit: count by layer, and share by normalised depth.

    Normalised depth of layer ``l`` in a model of ``L`` layers is ``l / (L - 1)`` (0 =
    first layer, 1 = last), so models of different depth (or methods) compare: the
    paper finds LOCOS heads concentrated in late layers (arXiv 2607.01002).

    Args:
        scores: one or several :class:`~locos_tl.HeadScores` (one bar colour each).
        k: number of top heads (highest scores).
        n_bins: depth bins over [0, 1] in the right panel.
        title: figure title.

    Returns:
        Two panels: left, ``Bar`` of the number of top-k heads per layer (hover lists the
        heads); right, ``Bar`` of the fraction of top-k heads per depth bin.
    """
    items = _as_list(scores)
    k = as_int(k, "k")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("by layer", "by normalised depth"))
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    centres = (edges[:-1] + edges[1:]) / 2
    for i, hs in enumerate(items):
        L = hs.n_layers
        top = hs.top_k(min(k, hs.n_layers * hs.n_heads))
        by_layer: list[list[str]] = [[] for _ in range(L)]
        for l, h in top:
            by_layer[l].append(head_label(l, h))
        counts = np.array([len(b) for b in by_layer])
        name = f"{hs.method} (top {len(top)})"
        color = _color(hs.method, i)
        fig.add_trace(
            go.Bar(
                x=list(range(L)), y=counts, name=name, legendgroup=name, marker_color=color,
                customdata=[", ".join(b) or "-" for b in by_layer],
                hovertemplate=f"{hs.method}<br>layer %{{x}}: %{{y}} heads<br>%{{customdata}}"
                "<extra></extra>",
            ),
            row=1, col=1,
        )
        depth = np.array([l / (L - 1) if L > 1 else 0.0 for l, _ in top])
        hist, _ = np.histogram(depth, bins=edges)
        frac = hist / max(len(top), 1)
        fig.add_trace(
            go.Bar(
                x=centres, y=frac, width=1.0 / n_bins * 0.9 / len(items), name=name,
                legendgroup=name, showlegend=False, marker_color=color,
                customdata=np.stack([edges[:-1], edges[1:], hist], -1),
                hovertemplate=f"{hs.method}<br>depth [%{{customdata[0]:.2f}}, "
                "%{customdata[1]:.2f}): %{customdata[2]:.0f} heads (%{y:.0%})<extra></extra>",
            ),
            row=1, col=2,
        )
    fig.update_xaxes(title_text="Layer", dtick=1 if max(h.n_layers for h in items) <= 40 else None,
                     row=1, col=1)
    fig.update_yaxes(title_text=f"top-{k} heads", row=1, col=1)
    fig.update_xaxes(title_text="normalised depth (layer / (n_layers - 1))", range=[0, 1],
                     row=1, col=2)
    fig.update_yaxes(title_text="fraction of top-k heads", tickformat=".0%", row=1, col=2)
    fig.update_layout(barmode="group", title=title or f"where the top-{k} heads sit")
    return fig
