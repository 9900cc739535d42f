"""Skip-wise position ids: long-context positions on short training sequences.

Positional skip-wise training (PoSE; Zhu et al. 2024, arXiv 2309.10400): a training
sequence of ``n`` real tokens is cut into chunks at a few boundaries, and every chunk
after a boundary has its position ids shifted by a random skip, so the sequence's
position ids span a *virtual* length ``T >= n``. Relative distances up to ``T`` (and the
distance from the first token, the attention sink) are then seen at the cost of ``n``
tokens. Within a chunk positions stay consecutive, so a previous-token head still sees
distance 1 between neighbours; boundaries are never placed right after an entity token,
so a ``NAME LANDMARK`` pair is never split.

The model must be called with an explicit all-ones ``attention_mask``: transformers 5
reads position ids that jump as *packed sequences* and would otherwise build a
block-diagonal mask (``masking_utils.find_packed_sequence_indices``).
"""

from __future__ import annotations

import numpy as np


def skip_positions(
    rng: np.random.Generator,
    n: int,
    target: int,
    *,
    forbidden: np.ndarray | None = None,
    last_boundary: int | None = None,
    max_chunks: int = 4,
) -> np.ndarray:
    """Position ids for ``n`` tokens that span ``target`` positions.

    Args:
        rng: numpy generator (all randomness comes from it).
        n: real sequence length.
        target: virtual length; the last position id is ``target - 1`` (``>= n``).
        forbidden: bool ``[n]``; ``True`` at ``b`` forbids a boundary just before token
            ``b`` (e.g. when token ``b - 1`` is an entity whose partner follows).
        last_boundary: boundaries lie in ``[2, last_boundary]`` (default ``n - 1``).
        max_chunks: at most this many chunks (``max_chunks - 1`` boundaries).

    Returns:
        int64 ``[n]``: non-decreasing by at least 1 per token, ``[0] == 0`` and
        ``[-1] == target - 1``; equal to ``arange(n)`` when ``target == n``.

    Raises:
        ValueError: ``target < n``.
    """
    if target < n:
        raise ValueError(f"target length {target} is shorter than the sequence ({n})")
    pos = np.arange(n, dtype=np.int64)
    extra = target - n
    hi = n - 1 if last_boundary is None else min(last_boundary, n - 1)
    cands = np.arange(2, hi + 1)
    if forbidden is not None:
        cands = cands[~forbidden[cands]]
    if extra == 0 or len(cands) == 0:
        if extra:
            pos[-1] += extra  # degenerate: no allowed boundary; skip before the last token
        return pos
    k = int(rng.integers(1, max_chunks)) if max_chunks > 1 else 1
    k = min(k, len(cands))
    bounds = np.sort(rng.choice(cands, size=k, replace=False))
    cuts = np.sort(rng.integers(0, extra + 1, size=k - 1))
    skips = np.diff(np.concatenate([[0], cuts, [extra]]))
    for b, s in zip(bounds, skips, strict=True):
        pos[b:] += s
    return pos
