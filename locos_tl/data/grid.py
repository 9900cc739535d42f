"""Grids of (length, depth) cells and seeded stratified sampling of trials.

Standard grids (Gema, Alex & Minervini 2026, arXiv 2607.01002, Sec. 5): detection on
lengths 1000..5000 x 10 depths; ablation evaluation on ``linspace(1000, 16000, 5)``
x depths {0, 25, 50, 75, 100}. NoLiMa's own evaluation (Modarressi et al. 2025,
arXiv 2502.05167) uses 26 depths.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from locos_tl.errors import DataFormatError

T = TypeVar("T")


@dataclass(frozen=True)
class GridCell:
    """One cell of a trial grid.

    Attributes:
        item: index of the probe (NoLiMa entry x test x question type, or NIAH probe).
        haystack_index: which book.
        length: prompt length in tokens.
        depth: needle depth in percent of the haystack part (0..100).
        character: the character name filling ``{CHAR}`` (``""`` for NIAH).
    """

    item: int
    haystack_index: int
    length: int
    depth: float
    character: str = ""


def linspace_lengths(lo: int, hi: int, n: int) -> list[int]:
    """``n`` prompt lengths evenly spaced from ``lo`` to ``hi`` tokens, rounded to ints.

    Raises:
        DataFormatError: ``n < 1``, ``lo < 1`` or ``hi < lo``.
    """
    if n < 1 or lo < 1 or hi < lo:
        raise DataFormatError(f"bad length range linspace({lo}, {hi}, {n})")
    return sorted({int(round(x)) for x in np.linspace(lo, hi, n)})


def linspace_depths(n: int, lo: float | int = 0.0, hi: float | int = 100.0) -> list[float]:
    """``n`` depths evenly spaced from ``lo`` to ``hi`` percent (default 0..100).

    Raises:
        DataFormatError: ``n < 1`` or a bound outside 0..100.
    """
    if n < 1 or not 0.0 <= lo <= hi <= 100.0:
        raise DataFormatError(f"bad depth range linspace({lo}, {hi}, {n})")
    return [round(float(x), 4) for x in np.linspace(lo, hi, n)]


def parse_lengths(spec: str | Sequence[int]) -> list[int]:
    """Parse a length grid: ``"1000,2000,4000"`` or ``"linspace:1000:16000:5"``.

    Raises:
        DataFormatError: unparsable spec, or a length below 1.
    """
    if not isinstance(spec, str):
        vals = [int(v) for v in spec]
    elif spec.strip().startswith("linspace"):
        lo, hi, n = _linspace_args(spec)
        return linspace_lengths(int(lo), int(hi), int(n))
    else:
        vals = [int(_num(v, spec)) for v in _split(spec)]
    if not vals or min(vals) < 1:
        raise DataFormatError(f"lengths must be positive token counts, got {spec!r}")
    return vals


def parse_depths(spec: str | Sequence[float | int]) -> list[float]:
    """Parse a depth grid in percent: ``"0,25,50"`` or ``"linspace:0:100:10"``.

    Raises:
        DataFormatError: unparsable spec, or a depth outside 0..100.
    """
    if not isinstance(spec, str):
        vals = [float(v) for v in spec]
    elif spec.strip().startswith("linspace"):
        lo, hi, n = _linspace_args(spec)
        return linspace_depths(int(n), lo, hi)
    else:
        vals = [_num(v, spec) for v in _split(spec)]
    if not vals or min(vals) < 0 or max(vals) > 100:
        raise DataFormatError(f"depths must be percentages in 0..100, got {spec!r}")
    return vals


def stratified_sample(
    cells: Sequence[T], n: int | None, key: Callable[[T], Hashable], seed: int = 0
) -> list[T]:
    """Seeded sample of ``n`` cells spread evenly over the strata given by ``key``.

    Strata are visited round-robin (in a seeded order), taking a seeded random cell of
    each, so stratum counts differ by at most one. The result keeps the input order.
    ``n=None`` or ``n >= len(cells)`` returns every cell.

    Raises:
        DataFormatError: ``n < 1``.
    """
    if n is None or n >= len(cells):
        return list(cells)
    if n < 1:
        raise DataFormatError(f"number of examples must be >= 1, got {n}")
    rng = random.Random(seed)
    strata: dict[Hashable, list[int]] = {}
    for i, c in enumerate(cells):
        strata.setdefault(key(c), []).append(i)
    groups = list(strata.values())
    rng.shuffle(groups)
    for g in groups:
        rng.shuffle(g)
    picked: list[int] = []
    level = 0
    while len(picked) < n:
        for g in groups:
            if level < len(g):
                picked.append(g[level])
                if len(picked) == n:
                    break
        level += 1
    return [cells[i] for i in sorted(picked)]


def _split(spec: str) -> list[str]:
    return [p for p in spec.replace(" ", ",").split(",") if p]


def _num(v: str, spec: str) -> float:
    try:
        return float(v)
    except ValueError as exc:
        raise DataFormatError(f"cannot parse {v!r} in grid spec {spec!r}") from exc


def _linspace_args(spec: str) -> tuple[float, float, float]:
    parts = spec.strip().split(":")
    if len(parts) != 4:
        raise DataFormatError(f"use linspace:MIN:MAX:N, got {spec!r}")
    return _num(parts[1], spec), _num(parts[2], spec), _num(parts[3], spec)
