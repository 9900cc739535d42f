"""Agreement between two head rankings (e.g. LOCOS vs CRI), overall and per layer third.

docs/concepts.md: Spearman rho, Kendall tau (``scipy.stats``) and top-k overlap for
k in {10, 20, 50}, also by layer bucket, to ask whether the direct-path approximation of
LOCOS (Gema, Alex & Minervini 2026, arXiv 2607.01002) hides mid-layer heads that the
causal score (CRI) finds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from scipy import stats
from torch import Tensor

from locos_tl.head_spec import parse_ks
from locos_tl.heads import HeadScores

BUCKETS = ("early", "middle", "late")


def layer_buckets(n_layers: int) -> dict[str, list[int]]:
    """Layers split into thirds (``numpy.array_split``: early, middle, late)."""
    return {name: [int(x) for x in part]
            for name, part in zip(BUCKETS, np.array_split(np.arange(n_layers), 3), strict=True)}


def _as_array(x: HeadScores | Tensor | np.ndarray) -> np.ndarray:
    s = x.scores if isinstance(x, HeadScores) else x
    s = s.detach().cpu().numpy() if isinstance(s, torch.Tensor) else np.asarray(s)
    if s.ndim != 2:
        raise ValueError(f"scores must be [n_layers, n_heads], got shape {s.shape}")
    return s.astype(np.float64)


def _top(flat: np.ndarray, idx: np.ndarray, k: int) -> set[int]:
    # descending score, ties broken by head index (as HeadScores.ranked)
    order = sorted(idx.tolist(), key=lambda i: (-flat[i], i))
    return set(order[:k])


def compare_rankings(
    a: HeadScores | Float[Tensor, "n_layers n_heads"] | np.ndarray,
    b: HeadScores | Float[Tensor, "n_layers n_heads"] | np.ndarray,
    ks: int | Sequence[int] = (10, 20, 50),
) -> pd.DataFrame:
    """Rank agreement of two per-head scores, overall and per layer third.

    Heads where either score is NaN are left out. Top-k overlap is
    ``|top_k(a) & top_k(b)| / k`` within the bucket (NaN when the bucket has fewer than
    ``k`` heads).

    Args:
        a, b: :class:`HeadScores` (their mean ``scores``) or ``[n_layers, n_heads]`` arrays.
        ks: the k of the top-k overlaps (an int or a list of ints >= 1; may be empty).

    Returns:
        One row per bucket (``all``, ``early``, ``middle``, ``late``): ``layers``,
        ``n_heads``, ``spearman``, ``spearman_p``, ``kendall``, ``kendall_p`` and
        ``top{k}_overlap`` for each k (all unitless, in [-1, 1] / [0, 1]).

    Raises:
        ValueError: shapes differ or are not 2-D; a k that is not an integer >= 1.
    """
    ks = parse_ks(ks, what="ks", allow_empty=True)
    A, B = _as_array(a), _as_array(b)
    if A.shape != B.shape:
        raise ValueError(f"score shapes differ: {A.shape} vs {B.shape}")
    L, H = A.shape
    fa, fb = A.ravel(), B.ravel()
    valid = ~(np.isnan(fa) | np.isnan(fb))
    groups = {"all": list(range(L)), **layer_buckets(L)}
    rows = []
    for name, layers in groups.items():
        idx = np.array([l * H + h for l in layers for h in range(H)], dtype=int)
        idx = idx[valid[idx]] if idx.size else idx
        row: dict[str, object] = {"bucket": name,
                                  "layers": f"{layers[0]}-{layers[-1]}" if layers else "",
                                  "n_heads": int(idx.size)}
        if idx.size >= 2 and np.ptp(fa[idx]) > 0 and np.ptp(fb[idx]) > 0:
            sp = stats.spearmanr(fa[idx], fb[idx])
            kt = stats.kendalltau(fa[idx], fb[idx])
            row.update(spearman=float(sp.statistic), spearman_p=float(sp.pvalue),
                       kendall=float(kt.statistic), kendall_p=float(kt.pvalue))
        else:
            row.update(spearman=np.nan, spearman_p=np.nan, kendall=np.nan, kendall_p=np.nan)
        for k in ks:
            row[f"top{k}_overlap"] = (len(_top(fa, idx, k) & _top(fb, idx, k)) / k
                                      if 0 < k <= idx.size else np.nan)
        rows.append(row)
    return pd.DataFrame(rows)
