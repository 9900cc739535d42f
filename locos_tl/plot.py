"""Plotly figures of head scores, ablation sweeps and per-position contributions.

One figure a function; each returns a ``plotly.graph_objects.Figure`` (call ``.show()``
in Jupyter, ``.write_html(path)`` for a self-contained file). Head heatmaps follow the
TransformerLens convention: x = head, y = layer (layer 0 on top), RdBu centred at 0,
hover label ``L{l}H{h}``.

The figures are those of Gema, Alex & Minervini (2026, arXiv 2607.01002): LOCOS head
maps, where the top heads sit in depth, ablation curves with random-seed error bars, the
dissociation score ``DS(k)``, LOCOS vs causal (CRI) rankings, and the per-position
contributions ``phi[l, h, j]`` (Eq. 2) that separate what a head *reads* (attention)
from what it *writes* toward the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from plotly.subplots import make_subplots
from torch import Tensor

from locos_tl.head_spec import HeadLike, as_int, parse_head, parse_heads
from locos_tl.heads import HeadScores, head_label

__all__ = [
    "ablation_curves",
    "compression_curves",
    "dissociation",
    "head_heatmap",
    "layer_distribution",
    "phi_explorer",
    "rank_scatter",
    "reads_vs_writes",
    "token_labels",
]

#: Colours of the methods, so one method has one colour in every figure.
METHOD_COLORS: dict[str, str] = {
    "locos": "#d62728",
    "wu": "#1f77b4",
    "headkv": "#9467bd",
    "headkv_anchor": "#c5b0d5",
    "attention_spatial": "#ff7f0e",
    "dla": "#8c564b",
    "cri": "#2ca02c",
    "random": "#7f7f7f",
    "bottom": "#bcbd22",
    "baseline": "#000000",
}
_FALLBACK = ["#17becf", "#e377c2", "#393b79", "#637939", "#8c6d31", "#843c39"]
_NEEDLE_FILL = "rgba(255, 193, 7, 0.30)"
_NEEDLE_LINE = "rgba(230, 150, 0, 0.9)"


def _color(method: str, i: int = 0) -> str:
    m = method.lower()
    if m.endswith("_bottom"):
        m = "bottom"
    return METHOD_COLORS.get(m, _FALLBACK[i % len(_FALLBACK)])


def _np(x: Any) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def _fmt(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{x:.4g}"


def _as_list(scores: HeadScores | Sequence[HeadScores]) -> list[HeadScores]:
    out = [scores] if isinstance(scores, HeadScores) else list(scores or [])
    if not out:
        raise ValueError("no HeadScores given")
    bad = next((x for x in out if not isinstance(x, HeadScores)), None)
    if bad is not None:
        raise ValueError(f"expected HeadScores (or a list of them), got {type(bad).__name__}; "
                         "wrap a [n_layers, n_heads] array as HeadScores(name, scores[None])")
    return out


def _positions(pair: Any, n: int, what: str) -> tuple[int, int]:
    """``(start, end)`` key positions with ``0 <= start < end <= n`` (end exclusive)."""
    try:
        a, b = (as_int(x, what) for x in pair)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a (start, end) pair of ints, got {pair!r}") from None
    if not 0 <= a < b <= n:
        raise ValueError(f"{what} ({a}, {b}) must satisfy 0 <= start < end <= {n} (end "
                         f"exclusive, {n} key positions)")
    return a, b


def token_labels(tokenizer: Any, ids: Sequence[int] | Tensor) -> list[str]:
    """One printable string a token (``\\n`` shown as ``⏎``), for the position axis.

    Args:
        tokenizer: a Hugging Face tokenizer (or a bridge with ``.tokenizer``).
        ids: token ids ``[pos]``.
    """
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    ids = [int(i) for i in (ids.tolist() if isinstance(ids, Tensor) else ids)]
    return [tok.decode([i]).replace("\n", "⏎") for i in ids]


# -- head maps -------------------------------------------------------------------------


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


# -- ablation sweeps ---------------------------------------------------------------------

_BASELINE_METHODS = ("none", "baseline")


def _check_columns(df: pd.DataFrame, cols: Sequence[str]) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"data frame lacks column(s) {missing}; has {list(df.columns)}")


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
    out["std"] = out["std"].fillna(0.0)
    order = {m: i for i, m in enumerate(dict.fromkeys(df["method"]))}
    return out.sort_values(["method", "k"], key=lambda c: c.map(order) if c.name == "method"
                           else c)


def ablation_curves(
    df: pd.DataFrame,
    *,
    metrics: Sequence[str] | None = None,
    log_x: bool = False,
    title: str | None = None,
) -> go.Figure:
    """Metric vs number of ablated heads ``k``, one line per method, one panel per metric.

    Methods with several seeds (the random-heads control) get error bars of one standard
    deviation over seeds. The no-ablation row (method ``"baseline"``, ``k = 0``) is the
    first point of every line; controls (``random``, ``*_bottom``) are dotted.

    Args:
        df: tidy rows with columns ``method, k, seed, metric, value, n_trials``, as
            :func:`locos_tl.evaluate.evaluate` returns (``value``: mean over trials).
        metrics: which metrics to draw, in order (default: all, in order of appearance).
        log_x: logarithmic k axis (the ``k = 0`` baseline is then a dashed line).
        title: figure title.

    Returns:
        A figure with one ``Scatter`` (lines+markers) per method and metric.
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
            :func:`locos_tl.evaluate.dissociation_score`.
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


# -- KV-cache compression ----------------------------------------------------------------

_CONTROL_RANKINGS = ("random", "uniform")
_DASHES = ("solid", "dash", "longdash", "dashdot")


def _wilson(k: np.ndarray, n: np.ndarray, z: float = 1.959964) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score 95 % interval ``(low, high)`` of ``k`` successes in ``n`` trials."""
    k, n = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = k / n
        den = 1 + z**2 / n
        mid = (p + z**2 / (2 * n)) / den
        half = z * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2)) / den
    return np.clip(mid - half, 0, 1), np.clip(mid + half, 0, 1)


def compression_curves(
    df: pd.DataFrame,
    *,
    title: str | None = None,
    x: str = "retained_fraction",
) -> go.Figure:
    """Accuracy against the retained fraction of the KV cache, one line per head ranking,
    one panel per task.

    Each point is the mean of ``correct`` over the trials of one (task, ranking,
    allocation, budget) cell, with a Wilson 95 % binomial interval as error bars. The x
    axis is logarithmic, in percent of the full cache (the mean of column ``x`` over the
    cell's trials, times 100). A dashed line marks the full-cache accuracy of each task
    (the rows with ``fraction == 1``), the reference every curve reaches at 100 %.
    Controls (rankings ``random``, ``uniform``) are dotted; a ranking swept under several
    allocations gets one line per allocation (``locos · proportional``), told apart by
    the dash.

    Head-guided compression is the efficiency use of retrieval heads argued by Gema, Alex
    & Minervini (2026, arXiv 2607.01002); budget allocation as in HeadKV (Fu et al.
    2025, arXiv 2410.19258). See ``docs/compression.md``.

    Args:
        df: the tidy frame of :func:`locos_tl.compress.compression_sweep`, one row per
            (ranking, allocation, unit, fraction, trial); needs columns ``ranking``,
            ``task``, ``correct`` (bool or 0/1) and ``x``; ``fraction`` (the requested
            budget; used to group trials when present, else ``x`` is) and
            ``allocation`` are optional.
        title: figure title.
        x: the column on the x axis: ``"retained_fraction"`` (measured share of the
            cache kept; default) or ``"fraction"`` (the requested budget).

    Returns:
        A figure with one ``Scatter`` (lines+markers, error bars) per task and line;
        ``y`` is the accuracy in [0, 1], ``x`` the retained share in percent.

    Raises:
        ValueError: a required column is missing (the message names it), no row, or an
            ``x`` other than ``"retained_fraction"`` / ``"fraction"``.
    """
    if x not in ("retained_fraction", "fraction"):
        raise ValueError(f"compression_curves: x={x!r}; use 'retained_fraction' (measured "
                         "share kept) or 'fraction' (requested budget)")
    _check_columns(df, ["ranking", "task", "correct", x])
    if df.empty:
        raise ValueError("compression_curves: the data frame has no row")
    d = df.copy()
    d["correct"] = d["correct"].astype(float)
    key = "fraction" if "fraction" in d.columns else x
    if "allocation" not in d.columns:
        d["allocation"] = ""
    d["allocation"] = d["allocation"].fillna("").astype(str)
    tasks = list(dict.fromkeys(d["task"]))
    rankings = list(dict.fromkeys(d["ranking"]))
    allocations = list(dict.fromkeys(d["allocation"]))
    n_alloc = d.groupby("ranking", sort=False)["allocation"].nunique()
    lines = list(dict.fromkeys(zip(d["ranking"], d["allocation"], strict=True)))
    g = d.groupby(["task", "ranking", "allocation", key], sort=True)
    stats = g.agg(x=(x, "mean"), acc=("correct", "mean"), hits=("correct", "sum"),
                  n=("correct", "count")).reset_index()
    low, high = _wilson(stats["hits"].to_numpy(), stats["n"].to_numpy())
    stats["low"], stats["high"] = low, high
    fig = make_subplots(
        rows=1, cols=len(tasks), shared_yaxes=True,
        subplot_titles=[f"{t} ({d.loc[d['task'] == t, 'trial'].nunique()} trials)"
                        if "trial" in d.columns else str(t) for t in tasks],
    )
    for c, task in enumerate(tasks, start=1):
        for ranking, allocation in lines:
            st = stats[(stats["task"] == task) & (stats["ranking"] == ranking)
                       & (stats["allocation"] == allocation)].sort_values("x")
            if st.empty:
                continue
            name = (f"{ranking} · {allocation}" if n_alloc[ranking] > 1 and allocation
                    else str(ranking))
            control = str(ranking).lower() in _CONTROL_RANKINGS
            dash = "dot" if control else _DASHES[allocations.index(allocation) % len(_DASHES)]
            xs = st["x"].to_numpy() * 100
            acc = st["acc"].to_numpy()
            fig.add_trace(
                go.Scatter(
                    x=xs, y=acc, mode="lines+markers", name=name, legendgroup=name,
                    showlegend=c == 1,
                    line={"color": _color(str(ranking), rankings.index(ranking)),
                          "dash": dash},
                    error_y={"type": "data", "symmetric": False,
                             "array": st["high"].to_numpy() - acc,
                             "arrayminus": acc - st["low"].to_numpy(), "thickness": 1},
                    customdata=np.stack([st[key].to_numpy(dtype=float) * 100, st["low"],
                                         st["high"], st["hits"], st["n"]], -1),
                    hovertemplate=f"{name} ({task})<br>kept %{{x:.3g}}% of the KV cache "
                    "(budget %{customdata[0]:.3g}%)<br>accuracy %{y:.2f} "
                    "[%{customdata[1]:.2f}, %{customdata[2]:.2f}] "
                    "(%{customdata[3]:.0f}/%{customdata[4]:.0f})<extra></extra>",
                ),
                row=1, col=c,
            )
        full = d[(d["task"] == task) & np.isclose(d[key].astype(float), 1.0)]
        if not full.empty:
            fig.add_hline(y=float(full["correct"].mean()), line_dash="dash",
                          line_color="black", line_width=1,
                          annotation_text="full cache", annotation_position="bottom left",
                          row=1, col=c, exclude_empty_subplots=False)
        ticks = sorted({float(v) * 100 for v in d[key].unique() if float(v) > 0})
        fig.update_xaxes(type="log", tickmode="array", tickvals=ticks,
                         ticktext=[f"{t:.3g}%" for t in ticks],
                         title_text=("retained KV cache" if x == "retained_fraction"
                                     else x) + " (% of full, log)", row=1, col=c)
    fig.update_yaxes(title_text="accuracy", range=[-0.03, 1.03], row=1, col=1)
    fig.update_layout(title=title or "accuracy under head-guided KV-cache compression",
                      hovermode="closest", width=None if len(tasks) < 3 else 420 * len(tasks))
    return fig


# -- positions ---------------------------------------------------------------------------


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
        phi: ``[n_layers, n_heads, pos]``, e.g. :func:`locos_tl.phi_tensor` or
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
    a, b = _positions(window, P, "window") if window is not None else (0, P)
    if needle_span is not None:
        needle_span = _positions(needle_span, P, "needle_span")
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
    a, b = _positions(window, P, "window") if window is not None else (0, P)
    if needle_span is not None:
        needle_span = _positions(needle_span, P, "needle_span")
    pos = np.arange(a, b)
    toks = list(tokens)[a:b]
    label = head_label(l, h)
    sub = ""
    if needle_span is not None:
        from locos_tl.kernel import spatial_contrast

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
