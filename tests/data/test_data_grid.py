"""Grids and seeded stratified sampling."""

from __future__ import annotations

from collections import Counter

import pytest

from locos_tl.data import (
    linspace_depths,
    linspace_lengths,
    parse_depths,
    parse_lengths,
    stratified_sample,
)
from locos_tl.errors import DataFormatError


def test_linspace_grids():
    assert linspace_lengths(1000, 16000, 5) == [1000, 4750, 8500, 12250, 16000]
    assert linspace_depths(5) == [0.0, 25.0, 50.0, 75.0, 100.0]
    assert len(linspace_depths(26)) == 26 and linspace_depths(26)[1] == 4.0
    assert linspace_lengths(1000, 1000, 3) == [1000]
    with pytest.raises(DataFormatError):
        linspace_lengths(2000, 1000, 3)
    with pytest.raises(DataFormatError):
        linspace_depths(0)


def test_parse_specs():
    assert parse_lengths("1000,2000, 4000") == [1000, 2000, 4000]
    assert parse_lengths("linspace:1000:16000:5") == [1000, 4750, 8500, 12250, 16000]
    assert parse_depths("0,50,100") == [0.0, 50.0, 100.0]
    assert parse_depths("linspace:0:100:3") == [0.0, 50.0, 100.0]
    assert parse_depths([0, 12.5]) == [0.0, 12.5]
    for bad in ("1000,abc", "linspace:1:2", "0"):
        with pytest.raises(DataFormatError):
            parse_lengths(bad)
    with pytest.raises(DataFormatError, match="0..100"):
        parse_depths("50,120")


def test_stratified_sample_balanced_seeded_ordered():
    cells = [(e, t, d, L) for e in "AB" for t in (1, 2, 3) for d in (0, 50) for L in range(5)]
    key = lambda c: c[:3]  # noqa: E731
    s = stratified_sample(cells, 20, key, seed=1)
    assert len(s) == 20 == len(set(s))
    counts = Counter(key(c) for c in s)
    assert len(counts) == 12 and max(counts.values()) - min(counts.values()) <= 1
    assert s == sorted(s, key=cells.index)
    assert s == stratified_sample(cells, 20, key, seed=1)
    assert s != stratified_sample(cells, 20, key, seed=2)
    assert stratified_sample(cells, None, key) == cells
    assert stratified_sample(cells, 10_000, key) == cells
    few = stratified_sample(cells, 5, key, seed=0)
    assert len({key(c) for c in few}) == 5
    with pytest.raises(DataFormatError):
        stratified_sample(cells, 0, key)
