"""Set differences of two head rankings, against a brute-force set computation."""

from __future__ import annotations

import itertools

import pytest
import torch

from locos_tl.experiments.set_difference import difference_sets, top_k_difference
from locos_tl.heads import HeadScores


def _scores(name, seed, shape=(4, 3)):
    g = torch.Generator().manual_seed(seed)
    return HeadScores(name, torch.randn((5, *shape), generator=g, dtype=torch.float64))


def _brute_top(s, k):
    m = s.trial_scores.mean(0)
    heads = list(itertools.product(range(m.shape[0]), range(m.shape[1])))
    return sorted(heads, key=lambda h: (-float(m[h]), h))[:k]


@pytest.mark.parametrize("k", [1, 3, 5, 12])
def test_difference_is_the_set_difference_in_rank_order(k):
    a, b = _scores("locos", 1), _scores("dla", 2)
    got = top_k_difference(a, b, k)
    top_a, top_b = _brute_top(a, k), set(_brute_top(b, k))
    assert got == [h for h in top_a if h not in top_b]
    assert len(got) == len(top_k_difference(b, a, k))  # |A\B| = |B\A| for equal k
    if k == 12:
        assert got == []


def test_difference_sets_names_both_directions_and_refuses_bad_input():
    a, b = _scores("locos", 1), _scores("dla", 2)
    sets = difference_sets({"locos": a, "dla": b}, ("locos", "dla"), ks=(3, 5))
    for k in (3, 5):
        if f"locos-dla@{k}" in sets:
            assert sets[f"locos-dla@{k}"] == top_k_difference(a, b, k)
            assert sets[f"dla-locos@{k}"] == top_k_difference(b, a, k)
    assert sets  # two random rankings of 12 heads differ in their top 5
    assert top_k_difference(a, a, 5) == []
    with pytest.raises(KeyError, match="'wu'"):
        difference_sets({"locos": a}, ("locos", "wu"))
    with pytest.raises(ValueError, match="1..12"):
        top_k_difference(a, b, 13)
    with pytest.raises(ValueError, match="different shapes"):
        top_k_difference(a, _scores("x", 3, shape=(2, 3)), 2)
