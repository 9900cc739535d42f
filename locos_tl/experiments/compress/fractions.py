"""Retained fractions of the KV cache: the one range check of the API and the CLI.

Pure Python (no torch), so ``locos compress`` checks ``--fractions`` before anything
heavy is imported; :func:`locos_tl.experiments.compress.compression_sweep` calls the same function.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from locos_tl.errors import LocosError

#: what a fraction is, said in every refusal
RANGE = "fractions must each lie in (0, 1], a share of the KV cache (0.1 = keep 10 %)"


def check_fractions(fractions: Iterable[Any]) -> list[float]:
    """The fractions (numbers, or strings such as ``"0.1"``) as floats, each in
    ``(0, 1]``, repeats dropped, order kept.

    ``0`` is refused: no cache at all is not a compression level (and a log-scale
    curve has no 0).

    Raises:
        LocosError: a value that is no number, one outside ``(0, 1]`` (NaN included),
            or none at all; the message starts with the offending value.
    """
    out: list[float] = []
    for value in fractions:
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise LocosError(f"{value!r} is not a number (give retained fractions such as "
                             "0.02,0.1,1)") from None
        if not 0.0 < f <= 1.0:
            raise LocosError(f"{f:g} is outside (0, 1]: {RANGE}")
        if f not in out:
            out.append(f)
    if not out:
        raise LocosError(f"no fraction given: {RANGE}")
    return out
