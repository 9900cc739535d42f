"""Accuracy under head-guided KV-cache compression against the retained share of the
cache."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from locos_tl.plot._common import _check_columns, _color

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


#: the y axis title of each score column
Y_TITLES = {"correct": "accuracy (first answer token)",
            "answer_correct": "accuracy (answer as a whole word)"}


def compression_curves(
    df: pd.DataFrame,
    *,
    title: str | None = None,
    x: str = "retained_fraction",
    y: str = "correct",
) -> go.Figure:
    """Accuracy against the retained fraction of the KV cache, one line per head ranking,
    one panel per task.

    Each point is the mean of column ``y`` over the trials of one (task, ranking,
    allocation, budget) cell, with a Wilson 95 % binomial interval as error bars. The x
    axis is logarithmic, in percent of the full cache (the mean of column ``x`` over the
    cell's trials, times 100). A dashed line marks the full-cache accuracy of each task
    (the rows with ``fraction == 1``), the reference every curve reaches at 100 %.
    Controls (rankings ``random``, ``uniform``) are dotted; a ranking swept under several
    allocations gets one line per allocation (``locos · proportional``), told apart by
    the dash.

    Budget allocation as in HeadKV (Fu et al. 2025, arXiv 2410.19258), here guided by
    any head ranking (LOCOS: Gema, Alex & Minervini 2026, arXiv 2607.01002). See
    ``docs/compression.md``.

    Args:
        df: the tidy frame of :func:`locos_tl.experiments.compress.compression_sweep`, one row per
            (ranking, allocation, unit, fraction, trial); needs columns ``ranking``,
            ``task``, ``y`` (bool or 0/1) and ``x``; ``fraction`` (the requested
            budget; used to group trials when present, else ``x`` is) and
            ``allocation`` are optional.
        title: figure title.
        x: the column on the x axis: ``"retained_fraction"`` (measured share of the
            cache kept; default) or ``"fraction"`` (the requested budget).
        y: the score: ``"correct"`` (the first response token is a first token of the
            answer; default, the organisms' answer is one token) or ``"answer_correct"``
            (the answer occurs in the response as a whole word, for models that answer
            in a sentence; not NoLiMa's substring ``contains``). Definitions:
            :mod:`locos_tl.experiments.task_metrics`.

    Returns:
        A figure with one ``Scatter`` (lines+markers, error bars) per task and line;
        ``y`` is the accuracy in [0, 1], ``x`` the retained share in percent.

    Raises:
        ValueError: a required column is missing (the message names it), no row, an
            ``x`` other than ``"retained_fraction"`` / ``"fraction"``, or a ``y`` other
            than ``"correct"`` / ``"answer_correct"``.
    """
    if x not in ("retained_fraction", "fraction"):
        raise ValueError(f"compression_curves: x={x!r}; use 'retained_fraction' (measured "
                         "share kept) or 'fraction' (requested budget)")
    if y not in ("correct", "answer_correct"):
        raise ValueError(f"compression_curves: y={y!r}; use 'correct' (first answer "
                         "token) or 'answer_correct' (the answer as a whole word in the "
                         "response)")
    _check_columns(df, ["ranking", "task", y, x])
    if df.empty:
        raise ValueError("compression_curves: the data frame has no row")
    d = df.copy()
    d["score"] = d[y].astype(float)
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
    stats = g.agg(x=(x, "mean"), acc=("score", "mean"), hits=("score", "sum"),
                  n=("score", "count")).reset_index()
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
            fig.add_hline(y=float(full["score"].mean()), line_dash="dash",
                          line_color="black", line_width=1,
                          annotation_text="full cache", annotation_position="bottom left",
                          row=1, col=c, exclude_empty_subplots=False)
        ticks = sorted({float(v) * 100 for v in d[key].unique() if float(v) > 0})
        fig.update_xaxes(type="log", tickmode="array", tickvals=ticks,
                         ticktext=[f"{t:.3g}%" for t in ticks],
                         title_text=("retained KV cache" if x == "retained_fraction"
                                     else x) + " (% of full, log)", row=1, col=c)
    fig.update_yaxes(title_text=Y_TITLES[y],
                     range=[-0.03, 1.03], row=1, col=1)
    fig.update_layout(title=title or "accuracy under head-guided KV-cache compression",
                      hovermode="closest", width=None if len(tasks) < 3 else 420 * len(tasks))
    return fig
