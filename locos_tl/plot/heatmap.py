"""Layer x head heatmaps of head scores (TransformerLens convention: x = head, y =
layer, layer 0 on top, RdBu centred at 0, hover ``L{l}H{h}``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from torch import Tensor

from locos_tl.heads import HeadScores, head_label
from locos_tl.plot._common import _fmt, _np

#: one map of head scores: a HeadScores, a ``[n_layers, n_heads]`` tensor or array, or a
#: data frame (``HeadScores.to_frame()``'s long form, or layers x heads wide)
HeadMap: TypeAlias = HeadScores | Tensor | np.ndarray | pd.DataFrame


@dataclass
class _Map:
    """One map as drawn: its name, ``[n_layers, n_heads]`` scores and CI bounds (NaN
    where unknown) and its number of trials (None where unknown)."""

    name: str
    z: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n_trials: int | None = None


def _from_array(name: str, x: Any) -> _Map:
    z = _np(x)
    if z.ndim != 2:
        raise ValueError(f"{name}: expected a [n_layers, n_heads] map, got shape {z.shape}")
    nan = np.full_like(z, np.nan)
    return _Map(name, z, nan, nan.copy())


def _int_labels(values: Any, what: str, name: str) -> np.ndarray:
    try:
        out = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        out = np.array([np.nan])
    if not (np.isfinite(out).all() and (out == np.round(out)).all() and (out >= 0).all()):
        raise ValueError(f"{name}: the {what} labels must be whole numbers >= 0 (layer and "
                         f"head numbers), got {list(values)[:8]}")
    return out.astype(int)


def _grid(name: str, layer: np.ndarray, head: np.ndarray, cols: dict[str, np.ndarray]) -> _Map:
    L, H = int(layer.max()) + 1, int(head.max()) + 1
    out = {}
    for key in ("score", "ci_low", "ci_high"):
        g = np.full((L, H), np.nan)
        if key in cols:
            g[layer, head] = cols[key]
        out[key] = g
    return _Map(name, out["score"], out["ci_low"], out["ci_high"])


def _from_frame(name: str, df: pd.DataFrame) -> list[_Map]:
    if df.empty:
        raise ValueError(f"{name}: the data frame has no rows")
    if {"layer", "head", "score"} <= set(df.columns):  # HeadScores.to_frame()'s long form
        groups = (list(df.groupby("method", sort=False)) if "method" in df.columns
                  and df["method"].nunique() > 1 else [(None, df)])
        maps = []
        for method, part in groups:
            label = (str(method) if method is not None else name
                     or (str(part["method"].iloc[0]) if "method" in part.columns else "scores"))
            layer = _int_labels(part["layer"], "layer", label)
            head = _int_labels(part["head"], "head", label)
            dup = pd.Series(list(zip(layer, head, strict=True))).duplicated().to_numpy()
            if dup.any():
                i = int(np.argmax(dup))
                raise ValueError(f"{label}: head {head_label(int(layer[i]), int(head[i]))} appears "
                                 f"twice (row {part.index[i]}); give one score a head")
            cols = {c: part[c].to_numpy(np.float64) for c in ("score", "ci_low", "ci_high")
                    if c in part.columns}
            m = _grid(label, layer, head, cols)
            if "n_trials" in part.columns:
                m.n_trials = int(part["n_trials"].max())
            maps.append(m)
        return maps
    bad = [c for c in df.columns if not pd.api.types.is_numeric_dtype(df[c])]
    if bad:
        raise ValueError(f"{name}: expected HeadScores.to_frame()'s columns (layer, head, "
                         f"score) or a layers x heads table of numbers; column(s) {bad} are "
                         "not numeric")
    name = name or "scores"
    layer = _int_labels(df.index, "row (layer)", name)
    head = _int_labels(df.columns, "column (head)", name)
    values = df.to_numpy(np.float64)
    ll, hh = np.meshgrid(layer, head, indexing="ij")
    return [_grid(name, ll.ravel(), hh.ravel(), {"score": values.ravel()})]


def _to_maps(name: str, x: Any) -> list[_Map]:
    if isinstance(x, HeadScores):
        low, high = (_np(t) for t in x.ci)
        return [_Map(name if name else x.method, _np(x.scores), low, high, x.n_trials)]
    if isinstance(x, pd.DataFrame):
        return _from_frame(name, x)
    if isinstance(x, Tensor | np.ndarray):
        return [_from_array(name or "scores", x)]
    raise ValueError(f"{name or 'scores'}: expected HeadScores, a [n_layers, n_heads] tensor "
                     f"or array, or a data frame; got {type(x).__name__}")


def _collect(scores: Any) -> list[_Map]:
    if isinstance(scores, Mapping):
        items = [(str(k), v) for k, v in scores.items()]
    elif isinstance(scores, HeadScores | Tensor | np.ndarray | pd.DataFrame):
        items = [("", scores)]
    elif isinstance(scores, Sequence) and not isinstance(scores, str):
        items = [("", v) for v in scores]
    else:
        raise ValueError("expected HeadScores, a [n_layers, n_heads] tensor or array, a data "
                         f"frame, or a list or dict of them; got {type(scores).__name__}")
    maps = [m for key, v in items for m in _to_maps(key, v)]
    if not maps:
        raise ValueError("no head scores given")
    if len(maps) > 1 and len({m.name for m in maps}) < len(maps):
        for i, m in enumerate(maps):
            m.name = f"{m.name} ({i + 1})"
    return maps


def _max_abs(z: np.ndarray) -> float:
    finite = np.abs(z[np.isfinite(z)])
    return float(finite.max()) if finite.size else 0.0


def head_heatmap(
    scores: HeadMap | Sequence[HeadMap] | Mapping[str, HeadMap],
    *,
    title: str | None = None,
    scale: Literal["shared", "per_map"] | None = None,
    normalize: bool = False,
) -> go.Figure:
    """Layer x head heatmap of head scores (RdBu, centred at 0, layer 0 on top).

    Args:
        scores: one map or several (e.g. LOCOS and Wu on the same trials), drawn side by
            side. A map is a :class:`~locos_tl.HeadScores`; a ``[n_layers, n_heads]``
            torch tensor or numpy array; or a data frame, either in
            :meth:`HeadScores.to_frame` form (columns ``layer``, ``head``, ``score``,
            optionally ``ci_low``, ``ci_high``, ``n_trials`` and ``method``: one map per
            method) or wide (rows are layers, columns are heads, both numbered from 0).
            A dict names its maps by its keys; otherwise a map is named by its method,
            or ``"scores"``.
        title: figure title (default: the method(s) and number of trials).
        scale: ``"shared"`` draws every map in its own units on one colour scale,
            ``[-m, m]`` with ``m`` the largest ``|score|`` of all maps: use it for maps
            in the same units (one method on two models). ``"per_map"`` divides each map
            by its own largest ``|score|`` (each subplot title gives that divisor), so
            methods in different units (logits, attention probability) share
            ``[-1, 1]``; a map whose largest score is tiny then looks as strong as one
            whose largest is large. The colour bar says which was used. Default
            ``"per_map"`` if ``normalize`` else ``"shared"``.
        normalize: the older spelling of ``scale="per_map"``.

    Returns:
        A figure with one ``Heatmap`` trace per map (``z`` is ``[n_layers, n_heads]``, as
        drawn: divided by the map's largest ``|score|`` under ``"per_map"``); hover shows
        ``L{l}H{h}``, the score in its own units and its bootstrap 95 % CI over trials
        (``n/a`` for an array or a frame without ``ci_low``/``ci_high``).

    Raises:
        ValueError: an input that is none of the above (the message names it), an array
            that is not 2-D, a frame with non-numeric cells or a head given twice, no
            maps, or ``normalize=True`` with ``scale="shared"``.
    """
    if scale is None:
        scale = "per_map" if normalize else "shared"
    elif scale not in ("shared", "per_map"):
        raise ValueError(f"scale must be 'shared' or 'per_map', got {scale!r}")
    elif normalize and scale == "shared":
        raise ValueError("normalize=True divides each map by its own max |score|; it "
                         "contradicts scale='shared' (pass one of the two)")
    maps = _collect(scores)
    n = len(maps)
    divisors = [_max_abs(m.z) for m in maps]
    if scale == "per_map":
        zs = [m.z / d if d > 0 else m.z for m, d in zip(maps, divisors, strict=True)]
        vmax, unit = 1.0, "score / the map's own max |score|"
    else:
        zs = [m.z for m in maps]
        vmax = max(divisors) or 1.0
        unit = "score, one scale for all maps" if n > 1 else (maps[0].name if maps[0].name
                                                              != "scores" else "score")

    def sub_title(m: _Map, d: float) -> str:
        t = m.name if m.n_trials is None else f"{m.name} ({m.n_trials} trials)"
        return f"{t}<br>max |score| {_fmt(d)}" if scale == "per_map" else t

    fig = make_subplots(
        rows=1, cols=n, shared_yaxes=True, horizontal_spacing=0.04 if n > 1 else 0.0,
        subplot_titles=[sub_title(m, d) for m, d in zip(maps, divisors, strict=True)]
        if n > 1 else None,
    )
    for i, (m, z) in enumerate(zip(maps, zs, strict=True)):
        L, H = z.shape
        labels = np.array([[head_label(l, h) for h in range(H)] for l in range(L)])
        fmt = np.vectorize(_fmt, otypes=[str])
        custom = np.stack([labels, fmt(m.z), fmt(m.low), fmt(m.high)], -1)
        fig.add_trace(
            go.Heatmap(
                z=z, x=list(range(H)), y=list(range(L)), customdata=custom, name=m.name,
                coloraxis="coloraxis",
                hovertemplate=f"<b>%{{customdata[0]}}</b> ({m.name})"
                "<br>score=%{customdata[1]}<br>95% CI [%{customdata[2]}, %{customdata[3]}]"
                "<extra></extra>",
            ),
            row=1, col=i + 1,
        )
        fig.update_xaxes(title_text="Head", dtick=1 if H <= 32 else None, row=1, col=i + 1)
    n_layers = max(z.shape[0] for z in zs)
    fig.update_yaxes(title_text="Layer", autorange="reversed",
                     dtick=1 if n_layers <= 40 else None, row=1, col=1)
    if title is None:
        m = maps[0]
        one = "head scores" if m.name == "scores" else f"{m.name} head scores"
        title = (("head scores: " + " vs ".join(x.name for x in maps)) if n > 1
                 else one + (f" ({m.n_trials} trials)" if m.n_trials is not None else ""))
        if n == 1 and scale == "per_map":
            title += f", max |score| {_fmt(divisors[0])}"
    fig.update_layout(
        title=title,
        coloraxis={"colorscale": "RdBu", "cmid": 0.0, "cmin": -vmax, "cmax": vmax,
                   "colorbar": {"title": {"text": unit}}},
        width=None if n == 1 else 380 * n + 120,
    )
    if scale == "per_map" and n > 1:  # room for the two-line subplot titles
        fig.update_layout(margin={"t": 130})
    return fig
