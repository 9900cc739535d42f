"""KV budgets (locos_tl.compress.budgets): hand-computed allocations, the GQA max rule,
floors, exact totals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from locos_tl.compress import Budgets, kv_budgets
from locos_tl.errors import LocosError


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
