"""Per-unit KV-cache budgets from a head ranking (query-agnostic context compression).

A *unit* is the smallest piece of the KV cache that gets its own retained set:

- ``unit="kv_group"`` (real eviction): the query heads that share one kv head under
  grouped-query attention read one stored K/V sequence, so the group is the unit. A
  query-head score becomes a kv-group score by ``group_reduce``: ``"max"`` (default;
  a group must keep its cache if *any* head reading it retrieves: evicting the needle
  from a group with one retrieval head removes it from that head too, whatever the
  other heads' scores) or ``"sum"`` (the group's total importance, HeadKV-style mass).
- ``unit="query_head"`` (the exact per-head variant): every query head gets its own
  retained set, applied as a per-query-head mask over the group's stored cache. Entries
  are counted per query head; memory is freed only where *every* query head of a group
  drops an entry (the group stores the union of its heads' sets).

Every unit keeps a floor of ``sinks`` first positions plus ``min_recent`` last context
positions (StreamingLLM's attention sinks + recent window, Xiao et al. 2024, arXiv
2309.17453). The total budget is ``round(fraction * n_units * context_len)`` entries,
split by ``allocation``:

- ``"greedy"``: units in rank order get the full cache until the budget runs out; the
  marginal unit gets the sinks plus a longer recent window; all others the floor. Ties
  are broken by ``(layer, unit)`` index.
- ``"proportional"``: HeadKV's allocation (Fu et al. 2025, arXiv 2410.19258, Sec. 3.2,
  and the authors' release ``FYYFU/HeadKV``: ``head_capacity = round(s_norm * pool +
  B - B / beta)`` with ``pool = (B / beta) * n_heads_total``): every unit a base of
  ``B - B / beta`` (``B`` the mean budget per unit, the base never below the floor),
  the remaining pool shared in proportion to the unit's (non-negative) score; a unit is
  capped at ``context_len`` and its excess redistributed to the others in proportion
  to their scores (water-filling), then rounded by largest remainder to the exact total.
- ``"uniform"``: the same budget everywhere.

Retained positions of a partial unit are the sinks plus the most recent positions
(StreamingLLM style); HeadKV's SnapKV token selection (query-window attention scores)
is *not* used: the compression is query-agnostic, the same retained set for any
question.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np
import pandas as pd

from locos_tl.errors import LocosError

Unit = Literal["kv_group", "query_head"]
Allocation = Literal["greedy", "proportional", "uniform"]
GroupReduce = Literal["max", "sum"]
UNITS: tuple[str, ...] = get_args(Unit)
ALLOCATIONS: tuple[str, ...] = get_args(Allocation)


@dataclass(frozen=True)
class Budgets:
    """Retained context entries per unit, and how they were chosen.

    Attributes:
        entries: ``[n_layers, n_units]`` int, retained context positions per unit.
        unit: ``"kv_group"`` or ``"query_head"``.
        allocation: ``"greedy"``, ``"proportional"`` or ``"uniform"``.
        fraction: the requested fraction of the context cache.
        context_len: context positions ``P`` (the prompt before the question).
        n_heads: query heads per layer.
        n_kv_heads: kv heads per layer.
        sinks: first positions every unit keeps.
        min_recent: last context positions every unit keeps (the floor's window).
        unit_scores: ``[n_layers, n_units]`` scores the allocation used (kv-group
            scores reduced from query heads by ``group_reduce``).
        group_reduce: ``"max"`` or ``"sum"`` (kv-group units only).
        method: name of the ranking (``"locos"``, ``"uniform"``, ...), for tables.
        meta: free provenance (HeadKV ``beta``, random ``seed``, floor warnings).
    """

    entries: np.ndarray
    unit: str
    allocation: str
    fraction: float
    context_len: int
    n_heads: int
    n_kv_heads: int
    sinks: int
    min_recent: int
    unit_scores: np.ndarray
    group_reduce: str = "max"
    method: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return int(self.entries.shape[0])

    @property
    def n_units(self) -> int:
        """Units per layer (kv heads or query heads)."""
        return int(self.entries.shape[1])

    @property
    def group_size(self) -> int:
        """Query heads per kv group."""
        return self.n_heads // self.n_kv_heads

    @property
    def retained_entries(self) -> int:
        """Retained context entries, summed over units."""
        return int(self.entries.sum())

    @property
    def full_entries(self) -> int:
        """Context entries of the full cache counted in the same units."""
        return self.n_layers * self.n_units * self.context_len

    @property
    def retained_fraction(self) -> float:
        """Actual retained fraction (within one entry of :attr:`fraction`)."""
        return self.retained_entries / self.full_entries if self.full_entries else 1.0

    def positions(self, layer: int, unit: int) -> np.ndarray:
        """Retained context positions of one unit, ascending: the first
        ``min(sinks, e)`` positions and the ``e - min(sinks, e)`` most recent ones."""
        return retained_positions(int(self.entries[layer, unit]), self.context_len, self.sinks)

    def head_positions(self, layer: int, head: int) -> np.ndarray:
        """Retained positions a query head sees (its kv group's set for kv-group units)."""
        unit = head // self.group_size if self.unit == "kv_group" else head
        return self.positions(layer, unit)

    def is_full(self) -> np.ndarray:
        """``[n_layers, n_units]`` bool: the unit keeps the whole context."""
        return self.entries >= self.context_len

    def to_frame(self) -> pd.DataFrame:
        """One row per unit: layer, unit, heads (``"L{l}H{h}"`` labels it covers),
        score, entries, full (bool), unit_fraction, plus the budget's settings."""
        rows = []
        G = self.group_size
        for l in range(self.n_layers):
            for u in range(self.n_units):
                heads = range(u * G, (u + 1) * G) if self.unit == "kv_group" else [u]
                e = int(self.entries[l, u])
                rows.append({
                    "layer": l, "unit": u,
                    "heads": ",".join(f"L{l}H{h}" for h in heads),
                    "score": float(self.unit_scores[l, u]), "entries": e,
                    "full": e >= self.context_len,
                    "unit_fraction": e / self.context_len if self.context_len else 1.0,
                    "unit_kind": self.unit, "allocation": self.allocation,
                    "method": self.method, "fraction": self.fraction,
                    "retained_fraction": self.retained_fraction,
                    "context_len": self.context_len,
                })
        return pd.DataFrame(rows)


def retained_positions(entries: int, context_len: int, sinks: int) -> np.ndarray:
    """Sinks plus most recent positions: ``[0, s) + [P - r, P)`` with
    ``s = min(sinks, entries)``, ``r = entries - s``; all ``P`` when ``entries >= P``."""
    if entries >= context_len:
        return np.arange(context_len)
    s = min(sinks, entries)
    r = entries - s
    return np.concatenate([np.arange(s), np.arange(context_len - r, context_len)])


def as_score_array(scores: Any) -> np.ndarray:
    """``[n_layers, n_heads]`` float64 scores from a HeadScores, a tensor or an array.

    Raises:
        LocosError: not two-dimensional.
    """
    if hasattr(scores, "scores") and hasattr(scores, "trial_scores"):  # HeadScores
        scores.check_rankable()
        scores = scores.scores
    if hasattr(scores, "detach"):
        scores = scores.detach().cpu().numpy()
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim != 2:
        raise LocosError(f"head scores must be [n_layers, n_heads], got shape {arr.shape}")
    return arr


def unit_scores(scores: np.ndarray, n_kv_heads: int, unit: str,
                group_reduce: str = "max") -> np.ndarray:
    """Query-head scores ``[L, H]`` -> unit scores ``[L, n_units]``.

    kv groups follow HF's ``repeat_kv`` layout: query head ``h`` reads kv head
    ``h // (H / n_kv_heads)``. NaN head scores are ignored (a group of only NaN is NaN).

    Raises:
        LocosError: ``H`` not divisible by ``n_kv_heads``; unknown unit or reduce.
    """
    L, H = scores.shape
    if unit == "query_head":
        return scores.copy()
    if unit != "kv_group":
        raise LocosError(f"unknown unit {unit!r}; use one of {UNITS}")
    if n_kv_heads < 1 or H % n_kv_heads:
        raise LocosError(f"{H} query heads cannot be split into {n_kv_heads} kv groups")
    grouped = scores.reshape(L, n_kv_heads, H // n_kv_heads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN group -> NaN
        if group_reduce == "max":
            return np.nanmax(grouped, axis=-1)
        if group_reduce == "sum":
            out = np.nansum(grouped, axis=-1)
            out[np.isnan(grouped).all(-1)] = np.nan
            return out
    raise LocosError(f"unknown group_reduce {group_reduce!r}; use 'max' or 'sum'")


def rank_order(us: np.ndarray) -> np.ndarray:
    """Flat unit indices by descending score, NaN last, ties by ``(layer, unit)``."""
    flat = us.reshape(-1)
    key = np.where(np.isnan(flat), np.inf, -flat)
    return np.lexsort((np.arange(flat.size), key))


def kv_budgets(
    scores: Any,
    fraction: float,
    context_len: int,
    n_kv_heads: int,
    *,
    unit: Unit = "kv_group",
    allocation: Allocation = "greedy",
    sinks: int = 4,
    min_recent: int = 8,
    group_reduce: GroupReduce = "max",
    beta: float = 1.2,
    method: str = "",
) -> Budgets:
    """Per-unit retained-entry budgets for a retained fraction of the context cache.

    Args:
        scores: ``[n_layers, n_heads]`` query-head scores (numpy, torch or
            :class:`~locos_tl.heads.HeadScores`); higher = keep first. NaN = lowest.
        fraction: retained fraction of the ``n_units * context_len`` context entries
            per layer, in ``[0, 1]``.
        context_len: context positions ``P`` (prompt tokens before the question).
        n_kv_heads: kv heads per layer (GQA groups).
        unit: ``"kv_group"`` (real eviction) or ``"query_head"`` (exact per-head mask).
        allocation: ``"greedy"``, ``"proportional"`` (HeadKV) or ``"uniform"``.
        sinks: first positions every unit keeps.
        min_recent: last positions every unit keeps.
        group_reduce: query-head -> kv-group score, ``"max"`` or ``"sum"``.
        beta: HeadKV's pool parameter (``"proportional"`` only): base ``B - B / beta``
            per unit, pool ``B / beta`` per unit shared by score; the authors sweep
            ``beta`` in ``{1.005, ..., 10}``.
        method: ranking name recorded in the result.

    Returns:
        :class:`Budgets` whose total is ``round(fraction * n_layers * n_units * P)``.
        When that total is below the floor (``n_units * (sinks + min_recent)`` per
        layer), the recent window (then the sinks) shrinks uniformly and a
        ``UserWarning`` says so.

    Raises:
        LocosError: fraction outside ``[0, 1]``, ``context_len < 1``, unknown unit,
            allocation or reduce, heads not divisible into groups, ``beta <= 1``.
    """
    arr = as_score_array(scores)
    if not 0.0 <= float(fraction) <= 1.0:
        raise LocosError(f"fraction must be in [0, 1], got {fraction!r}")
    if int(context_len) < 1:
        raise LocosError(f"context_len must be >= 1, got {context_len!r}")
    if allocation not in ALLOCATIONS:
        raise LocosError(f"unknown allocation {allocation!r}; use one of {ALLOCATIONS}")
    if sinks < 0 or min_recent < 0:
        raise LocosError("sinks and min_recent must be >= 0")
    C = int(context_len)
    us = unit_scores(arr, n_kv_heads, unit, group_reduce)
    L, U = us.shape
    n = L * U
    total = int(round(float(fraction) * n * C))
    floor = min(sinks + min_recent, C)
    order = rank_order(us)
    meta: dict[str, Any] = {}
    flat = np.zeros(n, dtype=np.int64)
    if total < n * floor:
        base = total // n
        flat[:] = base
        rest = order if allocation != "uniform" else np.arange(n)
        flat[rest[: total - base * n]] += 1
        meta["below_floor"] = True
        warnings.warn(
            f"a budget of {total} entries ({fraction:.3g} of {n} units x {C}) is below the "
            f"floor of {floor} entries per unit (sinks={sinks} + min_recent={min_recent}): "
            f"every unit keeps {base}-{base + 1} entries (the recent window, then the "
            "sinks, shrunk uniformly)", UserWarning, stacklevel=2)
    elif allocation == "greedy":
        flat[:] = floor
        extra = total - n * floor
        for i in order:
            if extra <= 0:
                break
            add = min(C - floor, extra)
            flat[i] += add
            extra -= add
    elif allocation == "uniform":
        base = total // n
        flat[:] = base
        flat[: total - base * n] += 1
    else:
        if not beta > 1.0:
            raise LocosError(f"HeadKV beta must be > 1, got {beta!r}")
        flat = _proportional(us.reshape(-1), total, C, floor, beta, order)
        meta["beta"] = float(beta)
    entries = flat.reshape(L, U)
    assert int(entries.sum()) == total and (entries <= C).all()
    return Budgets(entries=entries, unit=unit, allocation=allocation, fraction=float(fraction),
                   context_len=C, n_heads=arr.shape[1], n_kv_heads=int(n_kv_heads),
                   sinks=int(sinks), min_recent=int(min_recent), unit_scores=us,
                   group_reduce=group_reduce, method=method, meta=meta)


def _proportional(s: np.ndarray, total: int, C: int, floor: int, beta: float,
                  order: np.ndarray) -> np.ndarray:
    """HeadKV allocation with caps at ``C`` (water-filling), exact integer total."""
    n = s.size
    B = total / n
    base = min(C, max(floor, int(np.floor(B - B / beta))))
    pool = float(total - base * n)
    w = np.where(np.isfinite(s), np.maximum(s, 0.0), 0.0)
    a = np.full(n, float(base))
    free = np.ones(n, dtype=bool)
    while pool > 1e-9 and free.any():
        ww = w * free
        if ww.sum() <= 0:
            ww = free.astype(np.float64)  # no score left among free units: even split
        a = a + pool * ww / ww.sum()
        over = a > C
        pool = float((a[over] - C).sum())
        a[over] = C
        free &= a < C
    out = np.floor(a + 1e-9).astype(np.int64)
    left = total - int(out.sum())
    if left > 0:  # largest remainder; ties in rank order; never above the cap
        frac = a - out
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n)
        cand = np.lexsort((rank, -frac))
        cand = [i for i in cand if out[i] < C]
        for i in cand[:left]:
            out[i] += 1
    return out
