"""Two head scorings against each other (e.g. CRI vs LOCOS), with Spearman's rho."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from torch import Tensor

from locos_tl.heads import HeadScores, head_label
from locos_tl.plot._common import _np


def rank_scatter(
    a: HeadScores | Tensor | np.ndarray,
    b: HeadScores | Tensor | np.ndarray,
    *,
    names: tuple[str, str] | None = None,
    ranks: bool = False,
    title: str | None = None,
) -> go.Figure:
    """Scatter of two head scorings (e.g. CRI vs LOCOS), one point a head, coloured by layer.

    The title carries Spearman's rho over the heads where both are finite
    (``scipy.stats.spearmanr``).

    Args:
        a: x-axis scores, a :class:`~locos_tl.HeadScores` or a ``[n_layers, n_heads]``
            array.
        b: y-axis scores, same shape.
        names: axis names (default: the methods, or ``"a"``/``"b"`` for arrays).
        ranks: plot ranks (1 = highest score) instead of raw scores.
        title: figure title (the Spearman value is appended).

    Returns:
        A figure with one ``Scatter`` trace (markers coloured by layer, hover ``L{l}H{h}``
        with both scores and ranks).

    Raises:
        ValueError: the two scorings have different shapes.
    """
    from scipy.stats import rankdata, spearmanr

    za = _np(a.scores if isinstance(a, HeadScores) else a)
    zb = _np(b.scores if isinstance(b, HeadScores) else b)
    if za.shape != zb.shape or za.ndim != 2:
        raise ValueError(f"need two [n_layers, n_heads] scorings of one shape, got "
                         f"{za.shape} and {zb.shape}")
    na, nb = names or (
        a.method if isinstance(a, HeadScores) else "a",
        b.method if isinstance(b, HeadScores) else "b",
    )
    L, H = za.shape
    layer, head = np.divmod(np.arange(L * H), H)
    xa, xb = za.ravel(), zb.ravel()
    ok = np.isfinite(xa) & np.isfinite(xb)
    layer, head, xa, xb = layer[ok], head[ok], xa[ok], xb[ok]
    ra = rankdata(-xa, method="min") if xa.size else xa
    rb = rankdata(-xb, method="min") if xb.size else xb
    defined = xa.size > 2 and np.ptp(xa) > 0 and np.ptp(xb) > 0
    rho = float(spearmanr(xa, xb).statistic) if defined else float("nan")
    x, y = (ra, rb) if ranks else (xa, xb)
    labels = [head_label(int(l), int(h)) for l, h in zip(layer, head, strict=True)]
    fig = go.Figure(
        go.Scatter(
            x=x, y=y, mode="markers", name="heads",
            marker={"color": layer, "colorscale": "Viridis", "cmin": 0, "cmax": max(L - 1, 1),
                    "size": 8, "line": {"width": 0.5, "color": "white"},
                    "colorbar": {"title": {"text": "layer"}, "dtick": 1 if L <= 12 else None}},
            customdata=np.stack([labels, xa, xb, ra, rb], -1) if labels else None,
            hovertemplate=f"<b>%{{customdata[0]}}</b><br>{na}=%{{customdata[1]:.4g}} "
            f"(rank %{{customdata[3]}})<br>{nb}=%{{customdata[2]:.4g}} (rank %{{customdata[4]}})"
            "<extra></extra>",
        )
    )
    what = "rank" if ranks else "score"
    head_txt = f"{na} vs {nb}" if title is None else title
    fig.update_layout(
        title=f"{head_txt}: Spearman ρ = "
        + (f"{rho:.2f}" if np.isfinite(rho) else "undefined (a constant score)")
        + f" ({int(ok.sum())} heads)",
        xaxis_title=f"{na} {what}", yaxis_title=f"{nb} {what}",
    )
    if ranks:
        fig.update_xaxes(autorange="reversed")
        fig.update_yaxes(autorange="reversed")
    return fig
