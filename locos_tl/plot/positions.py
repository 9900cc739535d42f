"""Per-position figures of one step: LOCOS contributions ``phi[l, h, j]`` by head, and
where one head reads (attention) beside what it writes toward the answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from plotly.subplots import make_subplots
from torch import Tensor

from locos_tl.head_spec import HeadLike, parse_head, parse_heads
from locos_tl.heads import head_label
from locos_tl.plot._common import _NEEDLE_FILL, _NEEDLE_LINE, _np
from locos_tl.trials import as_span


def _key_span(pair: Any, n: int, what: str) -> tuple[int, int]:
    """``(start, end)`` key positions with ``0 <= start < end <= n`` (end exclusive):
    :func:`locos_tl.trials.as_span`, the one span check."""
    return as_span(pair, n, what, within=f"{n} key positions", error=ValueError)


def token_labels(tokenizer: Any, ids: Sequence[int] | Tensor) -> list[str]:
    """One printable string a token (``\\n`` shown as ``⏎``), for the position axis.

    Args:
        tokenizer: a Hugging Face tokenizer (or a bridge with ``.tokenizer``).
        ids: token ids ``[pos]``.
    """
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    ids = [int(i) for i in (ids.tolist() if isinstance(ids, Tensor) else ids)]
    return [tok.decode([i]).replace("\n", "⏎") for i in ids]


def _shade_needle(fig: go.Figure, span: tuple[int, int] | None, *, over: bool = False,
                  **where: Any) -> None:
    """Shade the needle's key positions: behind bars, or as a frame over a heatmap."""
    if span is None:
        return
    s, e = span
    fill = "rgba(0,0,0,0)" if over else _NEEDLE_FILL
    fig.add_vrect(x0=s - 0.5, x1=e - 0.5, fillcolor=fill, line_color=_NEEDLE_LINE,
                  line_width=2.5 if over else 1, layer="above" if over else "below", **where)


def _position_axis(fig: go.Figure, positions: np.ndarray, tokens: Sequence[str],
                   max_ticks: int, **where: Any) -> None:
    if len(positions) <= max_ticks:
        fig.update_xaxes(tickmode="array", tickvals=positions, ticktext=list(tokens),
                         tickangle=-60, **where)


def phi_explorer(
    phi: Float[Tensor, "n_layers n_heads pos"] | np.ndarray,
    tokens: Sequence[str],
    step: int | None = None,
    *,
    needle_span: tuple[int, int] | None = None,
    target: str | None = None,
    heads: Sequence[HeadLike] | None = None,
    window: tuple[int, int] | None = None,
    max_ticks: int = 120,
    title: str | None = None,
) -> go.Figure:
    """Position-by-head heatmap of LOCOS contributions ``phi[l, h, j]`` of one answer step.

    ``phi[l, h, j] = alpha[l, h, t, j] * u_{y_t} . (v_j W_O[l, h])`` (arXiv 2607.01002,
    Eq. 2), in logits: how much head ``(l, h)`` writes toward the step's token ``y_t``
    from key position ``j``. Rows are heads ``L{l}H{h}`` (layer-major), columns are key
    positions labelled with their token strings; the needle span is shaded.

    Args:
        phi: ``[n_layers, n_heads, pos]``, e.g. :func:`locos_tl.phi_from_model` or
            ``DecodeStep.phi``.
        tokens: token strings of the ``pos`` key positions (:func:`token_labels`).
        step: the answer step index ``t`` (shown in the title).
        needle_span: ``(s, e)`` key positions of the needle, end exclusive (shaded).
        target: the string of ``y_t`` (shown in the title).
        heads: draw only these rows (default: all), in any form of
            :func:`locos_tl.head_spec.parse_heads`: ``(layer, head)``, ``"L3H1"``,
            ``"3-1"``.
        window: draw only positions ``[a, b)`` (absolute positions stay on the axis).
        max_ticks: label the axis with token strings up to this many positions (hover
            always shows them).
        title: figure title.

    Returns:
        A figure with one ``Heatmap`` (``z`` is ``[n_heads_shown, n_positions]``).

    Raises:
        ValueError: ``phi`` is not 3-D or ``tokens`` does not match its last axis; a
            malformed head or one outside ``phi``'s layers x heads (``HeadSpecError``);
            a ``window`` or ``needle_span`` that is empty or outside the positions.
    """
    z3 = _np(phi)
    if z3.ndim != 3:
        raise ValueError(f"phi must be [n_layers, n_heads, pos], got shape {z3.shape}")
    L, H, P = z3.shape
    if len(tokens) != P:
        raise ValueError(f"{len(tokens)} token strings for {P} positions")
    rows = (parse_heads(heads, n_layers=L, n_heads=H) if heads is not None
            else [(l, h) for l in range(L) for h in range(H)])
    a, b = _key_span(window, P, "window") if window is not None else (0, P)
    if needle_span is not None:
        needle_span = _key_span(needle_span, P, "needle_span")
    pos = np.arange(a, b)
    z = np.stack([z3[l, h, a:b] for l, h in rows]) if rows else np.zeros((0, b - a))
    toks = list(tokens)[a:b]
    labels = [head_label(l, h) for l, h in rows]
    vmax = float(np.abs(z[np.isfinite(z)]).max()) if np.isfinite(z).any() else 1.0
    custom = np.stack([np.broadcast_to(np.array(toks, dtype=object), z.shape),
                       np.broadcast_to(np.array(labels, dtype=object)[:, None], z.shape)], -1)
    fig = go.Figure(
        go.Heatmap(
            z=z, x=pos, y=list(range(len(rows))), customdata=custom, colorscale="RdBu",
            zmid=0, zmin=-vmax or -1, zmax=vmax or 1, colorbar={"title": {"text": "phi (logits)"}},
            hovertemplate="<b>%{customdata[1]}</b><br>pos %{x}: %{customdata[0]}"
            "<br>phi=%{z:.4g}<extra></extra>",
        )
    )
    _shade_needle(fig, needle_span, over=True)
    if needle_span is not None:
        fig.add_annotation(x=(needle_span[0] + needle_span[1] - 1) / 2, y=1.0, yref="paper",
                           text="needle", showarrow=False, yanchor="bottom",
                           font={"color": _NEEDLE_LINE})
    _position_axis(fig, pos, toks, max_ticks)
    fig.update_yaxes(tickmode="array", tickvals=list(range(len(rows))), ticktext=labels,
                     autorange="reversed", title_text="head")
    fig.update_xaxes(title_text="key position (token)")
    what = f"step {step}" if step is not None else "one step"
    tgt = f" → {target!r}" if target is not None else ""
    fig.update_layout(title=title or f"phi by position and head, {what}{tgt}",
                      height=max(350, min(1400, 18 * len(rows) + 200)))
    return fig


def reads_vs_writes(
    pattern_row: Float[Tensor, "... pos"] | np.ndarray,
    phi_row: Float[Tensor, "... pos"] | np.ndarray,
    tokens: Sequence[str],
    head: HeadLike,
    *,
    needle_span: tuple[int, int] | None = None,
    target: str | None = None,
    window: tuple[int, int] | None = None,
    max_ticks: int = 120,
    title: str | None = None,
) -> go.Figure:
    """Where one head looks (attention ``alpha``) beside what it writes toward the answer
    (``phi``), over the key positions of one step.

    A literal retrieval head attends to the needle and writes the token it attends to; a
    non-literal head may attend to the needle while its answer-directed writing comes
    from a value moved there by an earlier layer, or attend elsewhere while the needle
    carries its ``phi`` (arXiv 2607.01002). Both panels share the position axis; the
    needle span is shaded; the subtitle gives the needle's share of attention and the
    LOCOS contrast of ``phi`` (Eq. 3).

    Args:
        pattern_row: attention of the head over key positions ``[pos]`` (or the whole
            ``[n_layers, n_heads, pos]`` pattern; then ``head`` selects the row).
        phi_row: ``phi`` of the head ``[pos]`` (or ``[n_layers, n_heads, pos]``).
        tokens: token strings of the key positions.
        head: ``(layer, head)``, a label such as ``"L3H1"`` or ``"3-1"`` (see
            :func:`locos_tl.head_spec.parse_head`).
        needle_span: ``(s, e)`` needle key positions, end exclusive.
        target: string of the answer token ``y_t`` (title).
        window: draw only positions ``[a, b)``.
        max_ticks: label the axis with token strings up to this many positions.
        title: figure title.

    Returns:
        Two stacked panels, each one ``Bar`` trace: attention (top) and phi (bottom).

    Raises:
        ValueError: the rows and tokens have different lengths; a malformed ``head`` or
            one outside a 3-D input's layers x heads (``HeadSpecError``); a ``window`` or
            ``needle_span`` that is empty or outside the positions.
    """
    att, ph = _np(pattern_row), _np(phi_row)
    dims = att.shape[:2] if att.ndim == 3 else ph.shape[:2] if ph.ndim == 3 else (None, None)
    l, h = parse_head(head, n_layers=dims[0], n_heads=dims[1])
    att = att[l, h] if att.ndim == 3 else att
    ph = ph[l, h] if ph.ndim == 3 else ph
    if not (att.shape == ph.shape == (len(tokens),)):
        raise ValueError(f"attention {att.shape}, phi {ph.shape} and {len(tokens)} tokens "
                         "must have one length")
    P = len(tokens)
    a, b = _key_span(window, P, "window") if window is not None else (0, P)
    if needle_span is not None:
        needle_span = _key_span(needle_span, P, "needle_span")
    pos = np.arange(a, b)
    toks = list(tokens)[a:b]
    label = head_label(l, h)
    sub = ""
    if needle_span is not None:
        from locos_tl.engine.kernel import spatial_contrast

        s, e = needle_span
        share = float(att[s:e].sum() / att.sum()) if att.sum() > 0 else float("nan")
        contrast = float(spatial_contrast(torch.as_tensor(ph), (s, e)))
        sub = f"<br><sup>attention on needle {share:.0%}; LOCOS contrast {contrast:+.3g}</sup>"
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=("reads: attention α", "writes: φ toward the answer"))
    fig.add_trace(
        go.Bar(x=pos, y=att[a:b], name="attention", marker_color="#1f77b4", customdata=toks,
               hovertemplate="pos %{x}: %{customdata}<br>α=%{y:.4f}<extra></extra>"),
        row=1, col=1,
    )
    fig.add_trace(
        go.Bar(x=pos, y=ph[a:b], name="phi", customdata=toks,
               marker_color=np.where(ph[a:b] >= 0, "#d62728", "#7f7f7f"),
               hovertemplate="pos %{x}: %{customdata}<br>φ=%{y:.4g} logits<extra></extra>"),
        row=2, col=1,
    )
    for r in (1, 2):
        _shade_needle(fig, needle_span, row=r, col=1)
    _position_axis(fig, pos, toks, max_ticks, row=2, col=1)
    fig.update_yaxes(title_text="attention", row=1, col=1)
    fig.update_yaxes(title_text="phi (logits)", row=2, col=1)
    fig.update_xaxes(title_text="key position (token)", row=2, col=1)
    tgt = f" toward {target!r}" if target is not None else ""
    fig.update_layout(title=(title or f"{label}: where it reads vs what it writes{tgt}") + sub,
                      showlegend=False, bargap=0.1, height=560)
    return fig
