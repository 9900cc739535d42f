"""KV budgets (locos_tl.experiments.compress.budgets): hand-computed allocations, the GQA max rule,
floors, exact totals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from locos_tl.errors import LocosError
from locos_tl.experiments.compress import Budgets, kv_budgets


def test_gqa_max_rule_and_sum_option():
    # one layer, 4 query heads over 2 kv groups {0,1} {2,3}
    s = np.array([[0.0, 0.9, 0.5, 0.5]])
    b = kv_budgets(s, 0.5, 100, 2, sinks=4, min_recent=8)
    assert b.unit_scores.tolist() == [[0.9, 0.5]]
    # total 100 entries = 2 floors of 12 + 76: all extra to group 0 (max 0.9)
    assert b.entries.tolist() == [[88, 12]]
    b_sum = kv_budgets(s, 0.5, 100, 2, group_reduce="sum", sinks=4, min_recent=8)
    assert b_sum.unit_scores.tolist() == [[0.9, 1.0]]
    assert b_sum.entries.tolist() == [[12, 88]]


def test_greedy_hand_computed():
    # 2 layers x 2 groups, C=100, floor 12: total 200 = 4 * 12 + 152 extra
    s = np.array([[0.1, 0.1, 0.7, 0.7], [0.9, 0.9, 0.2, 0.2]])
    b = kv_budgets(s, 0.5, 100, 2, allocation="greedy", sinks=4, min_recent=8)
    # rank: (1,0)=0.9 full (+88), (0,1)=0.7 marginal (+64), others floor
    assert b.entries.tolist() == [[12, 76], [100, 12]]
    assert b.retained_entries == 200 and b.retained_fraction == 0.5
    np.testing.assert_array_equal(b.positions(0, 1),
                                  np.r_[0:4, 100 - 72 : 100])  # sinks + longer window
    np.testing.assert_array_equal(b.positions(0, 0), np.r_[0:4, 92:100])
    np.testing.assert_array_equal(b.positions(1, 0), np.arange(100))
    assert b.is_full().tolist() == [[False, False], [True, False]]
    # query heads 0,1 read group 0
    np.testing.assert_array_equal(b.head_positions(1, 1), np.arange(100))


def test_greedy_ties_by_layer_then_unit():
    b = kv_budgets(np.zeros((2, 4)), 0.5, 100, 2, sinks=4, min_recent=8)
    assert b.entries.tolist() == [[100, 76], [12, 12]]


def test_nan_scores_rank_last():
    s = np.array([[np.nan, np.nan, 0.0, 0.0]])
    b = kv_budgets(s, 0.6, 50, 2, sinks=2, min_recent=2)
    assert b.entries.tolist() == [[10, 50]]


def test_proportional_headkv_hand_computed():
    # B = 50 per unit, beta 2: base 25, pool 100 shared by score 3:1:0:0
    b = kv_budgets(np.array([[3.0, 1.0, 0.0, 0.0]]), 0.5, 100, 2, unit="query_head",
                   allocation="proportional", beta=2.0)
    assert b.entries.tolist() == [[100, 50, 25, 25]]
    # capped: unit 0 would get 125; its 25 excess goes to the others (no score: evenly),
    # 100/3 each -> largest remainder gives the extra entry to the next in rank order
    b = kv_budgets(np.array([[1.0, 0.0, 0.0, 0.0]]), 0.5, 100, 2, unit="query_head",
                   allocation="proportional", beta=2.0)
    assert b.entries.tolist() == [[100, 34, 33, 33]]
    # water-filling redistributes in proportion to the remaining scores
    b = kv_budgets(np.array([[8.0, 2.0, 1.0, 1.0]]), 0.5, 100, 2, unit="query_head",
                   allocation="proportional", beta=2.0)
    # a = 25 + 100 * [8,2,1,1]/12 = [91.7, 41.7, 33.3, 33.3]: no cap
    assert b.entries.tolist() == [[92, 42, 33, 33]]
    b = kv_budgets(np.array([[8.0, 2.0, 1.0, 1.0]]), 0.7, 100, 2, unit="query_head",
                   allocation="proportional", beta=2.0)
    # B=70, base 35, pool 140: a0 = 128.3 -> capped; excess 28.3 shared 2:1:1
    # a = [100, 58.3 + 14.17, 46.7 + 7.08, 46.7 + 7.08] = [100, 72.5, 53.75, 53.75]
    # floors [100, 72, 53, 53] + 2 by largest remainder (0.75, 0.75 before 0.5)
    assert b.entries.tolist() == [[100, 72, 54, 54]]
    assert b.retained_entries == 280


def test_uniform_and_remainder():
    b = kv_budgets(np.array([[5.0, 0.0, 0.0, 0.0]]), 0.33, 10, 2, unit="query_head",
                   allocation="uniform", sinks=1, min_recent=1)
    assert b.entries.tolist() == [[4, 3, 3, 3]]  # 13 entries, remainder in index order


def test_below_floor_shrinks_recent_window_and_warns():
    with pytest.warns(UserWarning, match="below the floor"):
        b = kv_budgets(np.array([[1.0, 0.0, 0.0, 0.0]]), 0.05, 100, 2, unit="query_head",
                       sinks=4, min_recent=8)
    assert b.entries.tolist() == [[5, 5, 5, 5]]
    np.testing.assert_array_equal(b.positions(0, 0), [0, 1, 2, 3, 99])
    with pytest.warns(UserWarning):
        b = kv_budgets(np.zeros((1, 4)), 0.0, 100, 2)
    assert b.retained_entries == 0 and b.positions(0, 0).size == 0


@pytest.mark.parametrize("allocation", ["greedy", "proportional", "uniform"])
@pytest.mark.parametrize("unit", ["kv_group", "query_head"])
def test_retained_fraction_within_one_entry(allocation, unit):
    rng = np.random.default_rng(0)
    for frac in (0.12, 0.2, 0.37, 0.5, 0.83, 1.0):
        b = kv_budgets(rng.random((3, 8)), frac, 123, 2, unit=unit, allocation=allocation)
        assert abs(b.retained_entries - frac * b.full_entries) <= 1
        assert (b.entries <= 123).all() and (b.entries >= 12).all()
        for l in range(3):
            for u in range(b.n_units):
                assert b.positions(l, u).size == b.entries[l, u]
    assert isinstance(b, Budgets)


def test_headscores_input_and_frame():
    from locos_tl.heads import HeadScores

    ts = torch.tensor([[[0.0, 1.0, 0.2, 0.3]], [[0.0, 0.5, 0.2, 0.1]]], dtype=torch.float64)
    hs = HeadScores(method="locos", trial_scores=ts)
    b = kv_budgets(hs, 0.6, 40, 2, sinks=2, min_recent=2, method="locos")
    # head means [0, 0.75, 0.2, 0.2]; group max [0.75, 0.2]
    np.testing.assert_allclose(b.unit_scores, [[0.75, 0.2]])
    df = b.to_frame()
    assert b.entries.tolist() == [[40, 8]]
    assert df["entries"].sum() == b.retained_entries == 48
    assert df["heads"].tolist() == ["L0H0,L0H1", "L0H2,L0H3"]
    assert df["full"].tolist() == [True, False]


def test_errors():
    with pytest.raises(LocosError, match="fraction"):
        kv_budgets(np.zeros((1, 4)), 1.5, 10, 2)
    with pytest.raises(LocosError, match="kv groups"):
        kv_budgets(np.zeros((1, 4)), 0.5, 10, 3)
    # a bad Literal: LocosError at run time (TypeError under the tests' type checker)
    with pytest.raises((LocosError, TypeError), match="allocation"):
        kv_budgets(np.zeros((1, 4)), 0.5, 10, 2, allocation="snap")  # type: ignore[arg-type]
    with pytest.raises(LocosError, match=r"\[n_layers, n_heads\]"):
        kv_budgets(np.zeros(4), 0.5, 10, 2)


# a sliding-window layer (window 8: its full cache stores the last 7 context keys) and a
# full-attention layer, 2 kv groups each, context 40: the full cache stores 2 * (7 + 40)
CAP, C = [7, 40], 40
SLIDING_FIRST = np.array([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
FULL_FIRST = SLIDING_FIRST[::-1].copy()


@pytest.mark.parametrize("allocation", ["greedy", "proportional", "uniform"])
def test_capacity_no_unit_above_its_layer_and_the_budget_all_stored(allocation):
    for fraction in (0.45, 0.5, 0.8, 0.95):  # 0.45 * 94 = 42 entries, above the floor 38
        got = {}
        for name, s in (("sliding", SLIDING_FIRST), ("full", FULL_FIRST)):
            b = kv_budgets(s, fraction, C, 2, capacity=CAP, allocation=allocation)
            assert (b.entries[0] <= 7).all() and (b.entries[1] <= 40).all()
            assert b.full_entries == 2 * (7 + 40)
            assert b.retained_entries == round(fraction * 94)
            assert b.retained_fraction == b.retained_entries / 94
            got[name] = b.entries.tolist()
        if allocation == "greedy":  # whatever the ranking: the sliding units cannot take more
            assert got["sliding"] == got["full"]


def test_capacity_greedy_hand_computed():
    # total round(0.8 * 94) = 75; floors 7, 7 (capacity), 12, 12 = 38; 37 extra: the
    # sliding units are already full, so the ranking's surplus passes on: 28 to (1, 0),
    # 9 to (1, 1)
    b = kv_budgets(SLIDING_FIRST, 0.8, C, 2, capacity=CAP)
    assert b.entries.tolist() == [[7, 7], [40, 21]]
    assert b.is_full().tolist() == [[True, True], [True, False]]
    # a sliding unit keeps the last positions of its window (the sinks lie outside it)
    np.testing.assert_array_equal(b.positions(0, 0), np.arange(33, 40))
    np.testing.assert_array_equal(b.positions(1, 1), np.r_[0:4, 40 - 17 : 40])
    # uniform: 75 / 4 = 18.75 is above the sliding capacity: 7 each, 61 shared by the rest
    u = kv_budgets(SLIDING_FIRST, 0.8, C, 2, capacity=CAP, allocation="uniform")
    assert u.entries.tolist() == [[7, 7], [31, 30]]
    df = b.to_frame()
    assert df["capacity"].tolist() == [7, 7, 40, 40]
    assert df["unit_fraction"].tolist() == [1.0, 1.0, 1.0, 21 / 40]


def test_capacity_below_floor_and_partial_sliding_unit():
    # 0.1 * 94 = 9 entries < floors 38: shrunk evenly, in rank order
    with pytest.warns(UserWarning, match="below the floor"):
        b = kv_budgets(FULL_FIRST, 0.1, C, 2, capacity=CAP)
    assert b.entries.tolist() == [[2, 2], [3, 2]]
    np.testing.assert_array_equal(b.positions(0, 0), [38, 39])
    # a window covering the whole context is a full layer: sinks + recent
    # (17 entries: floors 3 each, then 3 to (0, 0), 2 to (0, 1))
    b = kv_budgets(SLIDING_FIRST, 0.7, 6, 2, capacity=[6, 6], sinks=2, min_recent=1)
    assert b.entries.tolist() == [[6, 5], [3, 3]]
    np.testing.assert_array_equal(b.positions(0, 1), [0, 1, 3, 4, 5])


def test_capacity_errors():
    with pytest.raises(LocosError, match="one integer per layer"):
        kv_budgets(SLIDING_FIRST, 0.5, C, 2, capacity=[7])
    with pytest.raises(LocosError, match=r"in \[0, context_len=40\]"):
        kv_budgets(SLIDING_FIRST, 0.5, C, 2, capacity=[7, 41])


def test_one_fraction_check_for_the_api_and_the_cli():
    """`compression_sweep(fractions=)` and `locos compress --fractions` share
    `check_fractions`, importable without torch (the CLI checks before loading)."""
    import subprocess
    import sys

    import typer

    from locos_tl.cli.compress import parse_fractions
    from locos_tl.experiments.compress.fractions import check_fractions

    assert check_fractions([0.5, "0.1", 0.5, 1]) == [0.5, 0.1, 1.0]
    assert parse_fractions(" 0.5, 0.1,,0.5,1 ") == [0.5, 0.1, 1.0]
    for bad, message in (([0.0], r"^0 is outside \(0, 1\]"), ([1.5], r"^1.5 is outside"),
                         ([float("nan")], "^nan is outside"), (["ten"], "'ten' is not a number"),
                         ([], "^no fraction given")):
        with pytest.raises(LocosError, match=message):
            check_fractions(bad)
        with pytest.raises(typer.BadParameter, match=message):
            parse_fractions(",".join(map(str, bad)))
    code = ("import sys; from locos_tl.experiments.compress import check_fractions; "
            "check_fractions([0.1]); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
