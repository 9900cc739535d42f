"""Where inserts go in a book cut to length: sentence boundaries nearest the requested
depths, and token spans that cover a character range (:mod:`locos_tl.data.prompt`)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from locos_tl.data.haystack import Haystack
from locos_tl.errors import TrialError


@dataclass(frozen=True)
class _Book:
    ends: tuple[int, ...]  # character end of book token i (cut after n tokens at ends[n-1])



def _insert(
    src: str,
    haystack: Haystack,
    book: _Book,
    start: int,
    t0: int,
    n: int,
    inserts: list[Any],  # locos_tl.data.prompt.Insert
    rank: int,
) -> tuple[str, list[int]]:
    """Insert texts at the sentence boundaries of ``src`` nearest their depths.

    The first insert (the needle) uses the ``rank``-th nearest boundary; returns the
    new text and each insert's character offset in it.
    """
    size = len(src)
    ss = haystack.sentence_starts
    lo, hi = bisect.bisect_left(ss, start), bisect.bisect_left(ss, start + size)
    cands = [x - start for x in ss[lo:hi]]
    cands.append(size)  # the end of the haystack is a boundary too
    placed = []
    for i, ins in enumerate(inserts):
        k = round(float(ins.depth) / 100.0 * n)
        target = book.ends[t0 + k - 1] - start if k > 0 else 0
        target = min(max(target, 0), size)
        placed.append((_nearest(cands, target, rank if i == 0 else 0), i))
    placed.sort()
    out: list[str] = []
    cur = 0  # length of text emitted so far
    pos = 0
    starts = [0] * len(inserts)
    for b, i in placed:
        seg = src[pos:b]
        out.append(seg)
        cur += len(seg)
        pos = b
        text = inserts[i].text
        if b >= size:
            if cur and not (out[-1][-1:] or " ").isspace():
                out.append(" ")
                cur += 1
            starts[i] = cur
            out.append(text)
            cur += len(text)
        else:
            starts[i] = cur
            out.append(text + " ")
            cur += len(text) + 1
    out.append(src[pos:])
    return "".join(out), starts


def _nearest(cands: list[int], target: int, rank: int) -> int:
    """The ``rank``-th nearest candidate to ``target`` (0 = nearest; ties go earlier)."""
    i = bisect.bisect_left(cands, target)
    lo, hi = i - 1, i
    picked = -1
    for _ in range(rank + 1):
        if lo >= 0 and (hi >= len(cands) or target - cands[lo] <= cands[hi] - target):
            picked, lo = cands[lo], lo - 1
        elif hi < len(cands):
            picked, hi = cands[hi], hi + 1
        else:
            break
    return picked


def _covering_span(offsets: Sequence[tuple[int, int]], a: int, b: int) -> tuple[int, int]:
    idx = [i for i, (x, y) in enumerate(offsets) if y > x and x < b and y > a]
    if not idx:
        raise TrialError(f"no token covers characters [{a}, {b}) of the prompt")
    return idx[0], idx[-1] + 1
