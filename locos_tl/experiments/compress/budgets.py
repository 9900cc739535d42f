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

A unit's *capacity* is the number of context entries its layer's full cache stores:
``context_len`` on a full-attention layer, the window on a sliding-window layer (a
transformers ``DynamicSlidingWindowLayer`` of window ``w`` keeps the last ``w - 1``
context keys; :func:`locos_tl.experiments.compress.context_capacity` reads it from the model's own
cache). No unit is given more than its capacity: what a sliding unit cannot store goes to
the next units of the ranking, so the budget is really stored whatever the ranking.

Every unit keeps a floor of ``sinks`` first positions plus ``min_recent`` last context
positions (StreamingLLM's attention sinks + recent window, Xiao et al. 2024, arXiv
2309.17453), or its whole capacity when that is smaller. The total budget is
``round(fraction * full_entries)`` entries, ``full_entries`` being the context entries
the full cache stores (``n_units x`` the layers' capacities summed; ``n_layers x n_units
x context_len`` without sliding windows), split by ``allocation``:

- ``"greedy"``: units in rank order get their whole capacity until the budget runs out;
  the marginal unit gets the sinks plus a longer recent window; all others the floor.
  Ties are broken by ``(layer, unit)`` index.
- ``"proportional"``: HeadKV's allocation (Fu et al. 2025, arXiv 2410.19258, Sec. 3.2,
  and the authors' release ``FYYFU/HeadKV``: ``head_capacity = round(s_norm * pool +
  B - B / beta)`` with ``pool = (B / beta) * n_heads_total``): every unit a base of
  ``B - B / beta`` (``B`` the mean budget per unit, the base never below the floor),
  the remaining pool shared in proportion to the unit's (non-negative) score; a unit is
  capped at its capacity and its excess redistributed to the others in proportion
  to their scores (water-filling), then rounded by largest remainder to the exact total.
- ``"uniform"``: the same budget everywhere (a unit below it at its capacity, the rest
  shared evenly by the others).

Retained positions of a partial unit are the sinks plus the most recent positions
(StreamingLLM style); on a sliding-window layer the most recent positions only (the
first positions are outside its window, it never stores them). HeadKV's SnapKV token
selection (query-window attention scores) is *not* used: the compression is
query-agnostic, the same retained set for any question.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np
import pandas as pd

from locos_tl.errors import LocosError, warn_caller

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
        capacity: ``[n_layers]`` int, context entries one unit of the layer's full cache
            stores (``context_len``, or the window's on a sliding-window layer); None:
            ``context_len`` everywhere.
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
    capacity: np.ndarray | None = None

    def __post_init__(self) -> None:
        cap = (np.full(self.entries.shape[0], self.context_len, dtype=np.int64)
               if self.capacity is None else np.asarray(self.capacity, dtype=np.int64))
        object.__setattr__(self, "capacity", cap)

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
        """Context entries the full cache stores, counted in the same units
        (``n_units x`` the layers' capacities summed)."""
        return self.n_units * int(self.capacity.sum())

    @property
    def retained_fraction(self) -> float:
        """The fraction actually stored: :attr:`retained_entries` / :attr:`full_entries`
        (within one entry of :attr:`fraction`; what the compressed cache stores, since no
        unit is given more than its capacity)."""
        return self.retained_entries / self.full_entries if self.full_entries else 1.0

    def positions(self, layer: int, unit: int) -> np.ndarray:
        """Retained context positions of one unit, ascending
        (:func:`retained_positions`)."""
        return retained_positions(int(self.entries[layer, unit]), self.context_len,
                                  self.sinks, int(self.capacity[layer]))

    def head_positions(self, layer: int, head: int) -> np.ndarray:
        """Retained positions a query head sees (its kv group's set for kv-group units)."""
        unit = head // self.group_size if self.unit == "kv_group" else head
        return self.positions(layer, unit)

    def is_full(self) -> np.ndarray:
        """``[n_layers, n_units]`` bool: the unit keeps everything its layer stores."""
        return self.entries >= self.capacity[:, None]

    def to_frame(self) -> pd.DataFrame:
        """One row per unit: layer, unit, heads (``"L{l}H{h}"`` labels it covers),
        score, entries, capacity, full (bool), unit_fraction (entries / capacity), plus
        the budget's settings."""
        rows = []
        G = self.group_size
        for l in range(self.n_layers):
            for u in range(self.n_units):
                heads = range(u * G, (u + 1) * G) if self.unit == "kv_group" else [u]
                e, cap = int(self.entries[l, u]), int(self.capacity[l])
                rows.append({
                    "layer": l, "unit": u,
                    "heads": ",".join(f"L{l}H{h}" for h in heads),
                    "score": float(self.unit_scores[l, u]), "entries": e,
                    "capacity": cap, "full": e >= cap,
                    "unit_fraction": e / cap if cap else 1.0,
                    "unit_kind": self.unit, "allocation": self.allocation,
                    "method": self.method, "fraction": self.fraction,
                    "retained_fraction": self.retained_fraction,
                    "context_len": self.context_len,
                })
        return pd.DataFrame(rows)


def retained_positions(entries: int, context_len: int, sinks: int,
                       capacity: int | None = None) -> np.ndarray:
    """A unit's retained context positions, ascending.

    Full-attention layer (``capacity`` None or ``>= context_len``): sinks plus most
    recent positions, ``[0, s) + [P - r, P)`` with ``s = min(sinks, entries)``,
    ``r = entries - s``; all ``P`` when ``entries >= P``. Sliding-window layer
    (``capacity < context_len``: it stores only the last ``capacity`` positions): the
    last ``min(entries, capacity)`` positions.
    """
    if capacity is not None and capacity < context_len:
        return np.arange(context_len - min(entries, capacity), context_len)
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


def layer_capacity(capacity: Any, n_layers: int, context_len: int) -> np.ndarray:
    """``[n_layers]`` int64 capacities: ``capacity`` checked, or ``context_len`` for
    every layer when it is None.

    Raises:
        LocosError: not one integer per layer, or one outside ``[0, context_len]``.
    """
    if capacity is None:
        return np.full(n_layers, context_len, dtype=np.int64)
    cap = np.asarray(capacity)
    if cap.shape != (n_layers,) or not np.issubdtype(cap.dtype, np.integer):
        raise LocosError(f"capacity must give one integer per layer ({n_layers}), got "
                         f"{np.asarray(capacity).tolist()!r}")
    if (cap < 0).any() or (cap > context_len).any():
        raise LocosError(f"capacity {cap.tolist()} must lie in [0, context_len="
                         f"{context_len}] (entries a layer's full cache stores)")
    return cap.astype(np.int64)


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
    capacity: Any = None,
) -> Budgets:
    """Per-unit retained-entry budgets for a retained fraction of the context cache.

    Args:
        scores: ``[n_layers, n_heads]`` query-head scores (numpy, torch or
            :class:`~locos_tl.heads.HeadScores`); higher = keep first. NaN = lowest.
        fraction: retained fraction of the context entries the full cache stores, in
            ``[0, 1]``.
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
        capacity: ``[n_layers]`` context entries per unit each layer's full cache
            stores (``context_len`` on full-attention layers, less on sliding-window
            layers): :func:`locos_tl.experiments.compress.context_capacity` of the model. None:
            ``context_len`` for every layer (a model without sliding windows).

    Returns:
        :class:`Budgets` whose total is ``round(fraction * full_entries)``
        (``full_entries = n_units x sum(capacity)``), no unit above its capacity. When
        that total is below the floor (``min(sinks + min_recent, capacity)`` per unit),
        the recent window (then the sinks) shrinks uniformly and a ``UserWarning`` says
        so.

    Raises:
        LocosError: fraction outside ``[0, 1]``, ``context_len < 1``, unknown unit,
            allocation or reduce, heads not divisible into groups, ``beta <= 1``, a
            capacity that is not one integer in ``[0, context_len]`` per layer.
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
    cap_layer = layer_capacity(capacity, L, C)
    caps = np.repeat(cap_layer, U)  # per flat unit, (layer, unit) order
    n = L * U
    total = int(round(float(fraction) * int(caps.sum())))
    floors = np.minimum(sinks + min_recent, caps)
    order = rank_order(us)
    meta: dict[str, Any] = {}
    if total < int(floors.sum()):
        flat = _even_split(total, floors, order if allocation != "uniform" else np.arange(n))
        meta["below_floor"] = True
        lo, hi = int(flat.min()), int(flat.max())
        warn_caller(
            f"a budget of {total} entries ({fraction:.3g} of {int(caps.sum())}) is below the "
            f"floor of {int(floors.sum())} entries (sinks={sinks} + min_recent={min_recent} "
            f"per unit): every unit keeps {lo}-{hi} entries (the recent window, then the "
            "sinks, shrunk uniformly)", UserWarning)
    elif allocation == "greedy":
        flat = floors.copy()
        extra = total - int(floors.sum())
        for i in order:  # a unit at its capacity passes the rest on to the next
            if extra <= 0:
                break
            add = min(int(caps[i] - flat[i]), extra)
            flat[i] += add
            extra -= add
    elif allocation == "uniform":
        flat = _even_split(total, caps, np.arange(n))
    else:
        if not beta > 1.0:
            raise LocosError(f"HeadKV beta must be > 1, got {beta!r}")
        flat = _proportional(us.reshape(-1), total, caps, floors, beta, order)
        meta["beta"] = float(beta)
    entries = flat.reshape(L, U)
    assert int(entries.sum()) == total and (flat <= caps).all()
    return Budgets(entries=entries, unit=unit, allocation=allocation, fraction=float(fraction),
                   context_len=C, n_heads=arr.shape[1], n_kv_heads=int(n_kv_heads),
                   sinks=int(sinks), min_recent=int(min_recent), unit_scores=us,
                   group_reduce=group_reduce, method=method, meta=meta, capacity=cap_layer)


def _even_split(total: int, caps: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``total`` entries shared as evenly as possible, no unit above ``caps``
    (water-filling); a remainder goes one entry each to units in ``order``.
    ``total <= caps.sum()``."""
    out = np.zeros(caps.size, dtype=np.int64)
    left = int(total)
    while left > 0:
        free = out < caps
        k = int(free.sum())
        if k == 0:  # every unit at its capacity (total > caps.sum(): a caller's error)
            break
        base = left // k
        if base == 0:  # fewer entries left than units with room: one each, in order
            for i in [i for i in order if free[i]][:left]:
                out[i] += 1
            break
        add = np.where(free, np.minimum(base, caps - out), 0)
        out += add
        left -= int(add.sum())
    return out


def _proportional(s: np.ndarray, total: int, caps: np.ndarray, floors: np.ndarray,
                  beta: float, order: np.ndarray) -> np.ndarray:
    """HeadKV allocation with caps at each unit's capacity (water-filling), exact
    integer total."""
    n = s.size
    B = total / n
    base = np.minimum(caps, np.maximum(floors, int(np.floor(B - B / beta)))).astype(np.float64)
    if base.sum() > total:  # capacities below the mean: the floors alone are the base
        base = floors.astype(np.float64)
    pool = float(total - base.sum())
    w = np.where(np.isfinite(s), np.maximum(s, 0.0), 0.0)
    a = base.copy()
    free = a < caps
    while pool > 1e-9 and free.any():
        ww = w * free
        if ww.sum() <= 0:
            ww = free.astype(np.float64)  # no score left among free units: even split
        a = a + pool * ww / ww.sum()
        over = a > caps
        pool = float((a[over] - caps[over]).sum())
        a[over] = caps[over]
        free &= a < caps
    out = np.floor(a + 1e-9).astype(np.int64)
    left = total - int(out.sum())
    if left > 0:  # largest remainder; ties in rank order; never above the cap
        frac = a - out
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n)
        cand = np.lexsort((rank, -frac))
        cand = [i for i in cand if out[i] < caps[i]]
        for i in cand[:left]:
            out[i] += 1
    return out
