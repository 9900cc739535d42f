"""``plot.compression_curves`` on a tidy frame shaped like ``compression_sweep``'s: the
plotted points are the per-cell accuracies, positions and Wilson intervals computed here
independently (pandas groupby, ``scipy.stats.binomtest``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from scipy.stats import binomtest

from locos_tl import plot

FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
LINES = (("locos", "greedy"), ("wu", "greedy"), ("headkv", "proportional"),
         ("uniform", "uniform"), ("random", "random"))


def sweep_frame(lines=LINES, n_trials: int = 12, seed: int = 0) -> pd.DataFrame:
    """Rows as ``compression_sweep`` returns them, with invented correctness (accuracy
    rising with the budget) and a measured share a little above the budget."""
    rng = np.random.default_rng(seed)
    rows = []
    for task in ("literal", "nonliteral"):
        for ranking, allocation in lines:
            for f in FRACTIONS:
                for t in range(n_trials):
                    kept = 1.0 if f == 1.0 else f + 0.02 * rng.random()
                    rows.append(dict(
                        ranking=ranking, allocation=allocation, unit="kv_group", fraction=f,
                        retained_fraction=kept, task=task, trial=f"{task}-{t}",
                        correct=bool(rng.random() < f ** 0.4 or f == 1.0), output="a",
                        answer="a", kv_bytes=int(kept * 4096), full_kv_bytes=4096,
                        context_len=120))
    return pd.DataFrame(rows)


def _traces(fig: go.Figure, task_col: int) -> dict[str, go.Scatter]:
    axis = "x" if task_col == 1 else f"x{task_col}"
    return {tr.name: tr for tr in fig.data if tr.xaxis == axis}


def test_points_are_the_cell_means_with_wilson_intervals():
    df = sweep_frame()
    fig = plot.compression_curves(df)
    tasks = ["literal", "nonliteral"]
    assert len(fig.data) == len(tasks) * len(LINES)
    for c, task in enumerate(tasks, start=1):
        traces = _traces(fig, c)
        assert set(traces) == {r for r, _ in LINES}  # one allocation each: plain names
        for ranking, _ in LINES:
            tr = traces[ranking]
            sub = df[(df.task == task) & (df.ranking == ranking)]
            for i, f in enumerate(FRACTIONS):
                cell = sub[sub.fraction == f]
                hits, n = int(cell.correct.sum()), len(cell)
                assert tr.y[i] == pytest.approx(hits / n)
                assert tr.x[i] == pytest.approx(100 * cell.retained_fraction.mean())
                ci = binomtest(hits, n).proportion_ci(0.95, method="wilson")
                assert tr.y[i] + tr.error_y.array[i] == pytest.approx(ci.high, abs=1e-6)
                assert tr.y[i] - tr.error_y.arrayminus[i] == pytest.approx(ci.low, abs=1e-6)
    xaxis = fig.layout.xaxis
    assert xaxis.type == "log"
    assert list(xaxis.tickvals) == pytest.approx([100 * f for f in FRACTIONS])
    assert xaxis.ticktext[0] == "2%" and xaxis.ticktext[-1] == "100%"


def test_full_cache_reference_and_styles():
    df = sweep_frame()
    fig = plot.compression_curves(df, title="mine")
    assert fig.layout.title.text == "mine"
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert len(lines) == 2  # one full-cache line a task
    for shape, task in zip(lines, ["literal", "nonliteral"], strict=True):
        full = df[(df.task == task) & (df.fraction == 1.0)].correct.mean()
        assert shape.y0 == shape.y1 == pytest.approx(full)
    traces = _traces(fig, 1)
    assert traces["locos"].line.color == plot.METHOD_COLORS["locos"]
    assert traces["wu"].line.color == plot.METHOD_COLORS["wu"]
    assert traces["random"].line.dash == "dot" and traces["uniform"].line.dash == "dot"
    assert traces["locos"].line.dash == "solid"
    assert [tr.showlegend for tr in fig.data].count(True) == len(LINES)


def test_x_the_requested_budget_and_several_allocations():
    df = sweep_frame(lines=(("locos", "greedy"), ("locos", "proportional"), ("wu", "greedy")))
    fig = plot.compression_curves(df, x="fraction")
    traces = _traces(fig, 2)
    assert set(traces) == {"locos · greedy", "locos · proportional", "wu"}
    assert traces["locos · greedy"].line.dash != traces["locos · proportional"].line.dash
    assert list(traces["wu"].x) == pytest.approx([100 * f for f in FRACTIONS])
    sub = df[(df.task == "nonliteral") & (df.ranking == "locos")
             & (df.allocation == "proportional")]
    assert list(traces["locos · proportional"].y) == pytest.approx(
        sub.groupby("fraction").correct.mean().tolist())


def test_missing_columns_are_named():
    df = sweep_frame().drop(columns=["task", "correct"])
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['task', 'correct'\]"):
        plot.compression_curves(df)
    with pytest.raises(ValueError, match="kv_fraction"):
        plot.compression_curves(sweep_frame(), x="kv_fraction")
    with pytest.raises(ValueError, match="no row"):
        plot.compression_curves(sweep_frame().iloc[:0])


def test_y_answer_correct_plots_the_word_match():
    """``y="answer_correct"`` plots the whole-word answer test (real models answer in
    a sentence, so their first token is rarely the name), and says so on the axis."""
    df = sweep_frame()
    rng = np.random.default_rng(1)
    df["answer_correct"] = rng.random(len(df)) < 0.5
    df["correct"] = False  # the first token never the name
    fig = plot.compression_curves(df, y="answer_correct")
    tr = _traces(fig, 1)["wu"]
    sub = df[(df.task == "literal") & (df.ranking == "wu")]
    want = [sub[sub.fraction == f].answer_correct.mean() for f in FRACTIONS]
    assert list(tr.y) == pytest.approx(want)
    full = df[(df.task == "literal") & (df.fraction == 1.0)].answer_correct.mean()
    assert fig.layout.shapes[0].y0 == pytest.approx(full)  # the full-cache line
    assert fig.layout.yaxis.title.text == "accuracy (answer as a whole word)"
    first = plot.compression_curves(df)
    assert max(_traces(first, 1)["wu"].y) == 0.0
    assert first.layout.yaxis.title.text == "accuracy (first answer token)"
    with pytest.raises(ValueError, match="y='output'"):
        plot.compression_curves(df, y="output")
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['answer_correct'\]"):
        plot.compression_curves(df.drop(columns=["answer_correct"]), y="answer_correct")
