"""Heads one ranking finds and another does not: the direct test of a detector's extra
information (e.g. LOCOS's needle contrast against direct logit attribution, which scores
what a head writes to the answer without asking where it reads from).

``top_k_difference(a, b, k)`` is ``top_k(a) \\ top_k(b)`` in ``a``'s rank order;
:func:`difference_sets` names both directions for several k, ready for
:func:`locos_tl.experiments.evaluate.ablation_sweep` with ``k=[len(heads)]`` and the
random-heads control of the same size.
"""

from __future__ import annotations

from collections.abc import Sequence

from locos_tl.heads import HeadScores

Head = tuple[int, int]


def top_k_difference(a: HeadScores, b: HeadScores, k: int) -> list[Head]:
    """The heads in ``a``'s top ``k`` that are not in ``b``'s top ``k``, in ``a``'s rank
    order (:meth:`HeadScores.ranked`: descending score, ties by head index).

    Raises:
        ValueError: ``k`` is not in ``1..n_layers * n_heads``, or the two rankings are
            over models of different shapes.
    """
    if tuple(a.scores.shape) != tuple(b.scores.shape):
        raise ValueError(f"rankings of different shapes: {tuple(a.scores.shape)} and "
                         f"{tuple(b.scores.shape)}")
    n = a.scores.numel()
    if not 1 <= k <= n:
        raise ValueError(f"k must be in 1..{n}, got {k}")
    top_b = set(_ranked(b)[:k])
    return [h for h in _ranked(a)[:k] if h not in top_b]


def difference_name(a: str, b: str, k: int) -> str:
    """The name of ``top_k(a) \\ top_k(b)``: ``"a-b@k"``."""
    return f"{a}-{b}@{k}"


def difference_sets(rankings: dict[str, HeadScores], pair: tuple[str, str],
                    ks: Sequence[int] = (5, 10, 20)) -> dict[str, list[Head]]:
    """``{"A-B@k": heads, "B-A@k": heads}`` for each ``k`` (empty differences left out).

    Args:
        rankings: method name -> scores.
        pair: the two method names ``(A, B)``.
        ks: the k of the top-k sets.

    Raises:
        KeyError: a name of ``pair`` is not in ``rankings``.
        ValueError: see :func:`top_k_difference`.
    """
    a_name, b_name = pair
    for name in pair:
        if name not in rankings:
            raise KeyError(f"no ranking called {name!r}; have {sorted(rankings)}")
    out: dict[str, list[Head]] = {}
    for k in ks:
        for x, y in ((a_name, b_name), (b_name, a_name)):
            heads = top_k_difference(rankings[x], rankings[y], k)
            if heads:
                out[difference_name(x, y, k)] = heads
    return out


def _ranked(s: HeadScores) -> list[Head]:
    return [(int(layer), int(head)) for layer, head in s.ranked()]
