"""Layer x head heatmaps of head scores (TransformerLens convention: x = head, y =
layer, layer 0 on top, RdBu centred at 0, hover ``L{l}H{h}``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from locos_tl.heads import HeadScores, head_label
from locos_tl.plot._common import _as_list, _fmt, _np


def head_heatmap(
    scores: HeadScores | Sequence[HeadScores],
    *,
    title: str | None = None,
    normalize: bool = False,
) -> go.Figure:
    """Layer x head heatmap of head scores (RdBu, centred at 0, layer 0 on top).

    Args:
        scores: one :class:`~locos_tl.HeadScores`, or several (e.g. LOCOS and Wu on the
            same trials), drawn side by side on one shared colour scale.
        title: figure title (default: method and number of trials).
        normalize: divide each method's map by its largest ``|score|`` so methods in
            different units (logits vs attention probability) share the scale [-1, 1].

    Returns:
        A figure with one ``Heatmap`` trace per method (``z`` is ``[n_layers, n_heads]``);
        hover shows ``L{l}H{h}``, the score and its bootstrap 95 % CI over trials.
    """
    items = _as_list(scores)
    zs = []
    for hs in items:
        z = _np(hs.scores)
        if normalize:
            m = np.nanmax(np.abs(z)) if np.isfinite(z).any() else 0.0
            z = z / m if m > 0 else z
        zs.append(z)
    finite = [np.abs(z[np.isfinite(z)]) for z in zs]
    vmax = max((float(f.max()) for f in finite if f.size), default=1.0) or 1.0
    n = len(items)
    fig = make_subplots(
        rows=1, cols=n, shared_yaxes=True, horizontal_spacing=0.04 if n > 1 else 0.0,
        subplot_titles=[f"{hs.method} ({hs.n_trials} trials)" for hs in items] if n > 1 else None,
    )
    for i, (hs, z) in enumerate(zip(items, zs, strict=True)):
        L, H = z.shape
        s = _np(hs.scores)
        low, high = (_np(t) for t in hs.ci)
        labels = np.array([[head_label(l, h) for h in range(H)] for l in range(L)])
        custom = np.stack(
            [labels, np.vectorize(_fmt)(s), np.vectorize(_fmt)(low), np.vectorize(_fmt)(high)],
            -1,
        )
        fig.add_trace(
            go.Heatmap(
                z=z, x=list(range(H)), y=list(range(L)), customdata=custom, name=hs.method,
                coloraxis="coloraxis",
                hovertemplate=f"<b>%{{customdata[0]}}</b> ({hs.method})"
                "<br>score=%{customdata[1]}<br>95% CI [%{customdata[2]}, %{customdata[3]}]"
                "<extra></extra>",
            ),
            row=1, col=i + 1,
        )
        fig.update_xaxes(title_text="Head", dtick=1 if H <= 32 else None, row=1, col=i + 1)
    unit = "score / max|score|" if normalize else (items[0].method if n == 1 else "score")
    n_layers = max(hs.n_layers for hs in items)
    fig.update_yaxes(title_text="Layer", autorange="reversed",
                     dtick=1 if n_layers <= 40 else None, row=1, col=1)
    fig.update_layout(
        title=title or (f"{items[0].method} head scores ({items[0].n_trials} trials)" if n == 1
                        else "head scores: " + " vs ".join(hs.method for hs in items)),
        coloraxis={"colorscale": "RdBu", "cmid": 0.0, "cmin": -vmax, "cmax": vmax,
                   "colorbar": {"title": {"text": unit}}},
        width=None if n == 1 else 380 * n + 120,
    )
    return fig
