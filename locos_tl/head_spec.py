"""One parser for every argument that names attention heads, and for head counts ``k``.

Every function and command that takes heads (:func:`locos_tl.ablate`,
:func:`locos_tl.ablation_sweep` ``head_sets``, :func:`locos_tl.random_heads` ``exclude``, the
plot functions, ``locos ablate --heads``) goes through :func:`parse_heads` /
:func:`parse_head`, so a head is written the same way everywhere and a malformed one is
refused with one message (:data:`HEAD_FORMS`) instead of being read as something else.

Accepted forms of one head (``layer`` and ``head`` are 0-based indices; ``head`` is the
*query*-head index, as in TransformerLens' ``hook_q`` / ``hook_z``):

- a ``(layer, head)`` pair of non-negative integers (tuple, list, or a length-2 integer
  array; Python, numpy or 0-d torch integers);
- the TransformerLens label ``"L{layer}H{head}"``, e.g. ``"L14H3"`` (case-insensitive);
- the reference implementation's key ``"{layer}-{head}"``, e.g. ``"14-3"`` (the keys of
  ``heads.json``, :meth:`locos_tl.HeadScores.to_reference_dict`).

Everything else is refused: floats (``(1.7, 2)``), booleans, negative indices
(``(-1, 0)`` is not "the last layer"), strings such as ``"12"`` or ``"L-1H0"``, triples,
and -- when the model's geometry is known -- indices outside ``n_layers x n_heads``.
"""

from __future__ import annotations

import numbers
import operator
import re
from collections.abc import Iterable, Mapping
from typing import Any

from locos_tl.errors import HeadSpecError

Head = tuple[int, int]
HeadLike = Any
"""One head in any accepted form (``(1, 2)``, ``"L1H2"``, ``"1-2"``); checked at run time
by :func:`parse_head`, hence ``Any`` for static type checkers."""

HEAD_FORMS = ("a head is a (layer, head) pair of non-negative ints such as (1, 2), a label "
              "such as 'L1H2', or the reference form '1-2'")

_LABEL = re.compile(r"[Ll]([0-9]+)[Hh]([0-9]+)")
_REFERENCE = re.compile(r"([0-9]+)-([0-9]+)")


def model_dims(model: Any) -> tuple[int, int]:
    """``(n_layers, n_heads)`` of a TransformerBridge (``model.cfg``).

    Raises:
        HeadSpecError: ``model`` has no ``cfg.n_layers`` / ``cfg.n_heads``.
    """
    cfg = getattr(model, "cfg", None)
    try:
        return int(cfg.n_layers), int(cfg.n_heads)  # type: ignore[union-attr]
    except (AttributeError, TypeError, ValueError):
        raise HeadSpecError(f"cannot read n_layers / n_heads from {type(model).__name__} "
                            "(expected a TransformerBridge with .cfg)") from None


def check_confidence(value: Any, name: str = "confidence") -> float:
    """``value`` as a confidence level: a real number strictly between 0 and 1.

    Args:
        value: the level given, e.g. ``0.95`` (not ``95``).
        name: the argument's name, for the message (``"ci"``, ``"level"``).

    Returns:
        ``float(value)``.

    Raises:
        ValueError: ``value`` is not a real number (a bool, a string, None, an array) or
            not in the open interval (0, 1) (NaN, 0, 1, 95, -0.5), with the message
            ``"<name> must be a confidence level in (0, 1), such as 0.95; got <value>"``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < 1:
        raise ValueError(f"{name} must be a confidence level in (0, 1), such as 0.95; "
                         f"got {value!r}")
    return float(value)


def as_int(x: Any, what: str, error: type[Exception] = HeadSpecError) -> int:
    """``x`` as a Python int; refuses bools, floats (even ``2.0``) and strings.

    Accepts Python ints, numpy integers and one-element integer torch tensors. The one
    integer check of the package (head indices, counts, token ids, span bounds).

    Args:
        x: the value.
        what: its name, for the message (e.g. ``"k"``, ``"Trial.tokens[3]"``).
        error: the exception class raised (e.g. :class:`~locos_tl.errors.TrialError`
            for a trial's fields).

    Raises:
        HeadSpecError: (or ``error``) ``x`` is not an integer; the message names
            ``what`` and the value's type.
    """
    dtype = str(getattr(x, "dtype", ""))
    if not isinstance(x, bool) and not any(s in dtype for s in ("bool", "float", "complex")):
        try:
            return operator.index(x)
        except TypeError:
            pass
    raise error(f"{what} must be an integer, got {type(x).__name__} {x!r}")


def as_count(k: Any, what: str = "k") -> int:
    """``k`` as a non-negative Python int (a number of heads).

    Raises:
        HeadSpecError: ``k`` is not an integer (see :func:`as_int`) or is negative.
    """
    n = as_int(k, what)
    if n < 0:
        raise HeadSpecError(f"{what} must be >= 0, got {n}")
    return n


def _check_range(lh: Head, what: str, n_layers: int | None, n_heads: int | None) -> Head:
    l, h = lh
    if l < 0 or h < 0:
        raise HeadSpecError(f"{what} = {lh}: indices must be non-negative (no counting "
                            f"from the end); {HEAD_FORMS}")
    if (n_layers is not None and l >= n_layers) or (n_heads is not None and h >= n_heads):
        geom = f"{n_layers if n_layers is not None else '?'} layers x " \
               f"{n_heads if n_heads is not None else '?'} heads"
        valid = (f"layer 0..{n_layers - 1 if n_layers is not None else '?'}, "
                 f"head 0..{n_heads - 1 if n_heads is not None else '?'}")
        raise HeadSpecError(f"{what}: head {lh} is outside the model's {geom} ({valid})")
    return lh


def parse_head(
    item: Any, *, n_layers: int | None = None, n_heads: int | None = None,
    what: str = "head",
) -> Head:
    """One head in any accepted form (see the module docstring) as a ``(layer, head)`` pair.

    Args:
        item: ``(layer, head)``, ``"L{layer}H{head}"`` or ``"{layer}-{head}"``.
        n_layers, n_heads: the model's geometry; when given, indices must lie inside it.
        what: how the argument is named in the error message.

    Returns:
        ``(layer, head)`` as Python ints.

    Raises:
        HeadSpecError: (a ``LocosError`` and ``ValueError``) ``item`` is in no accepted
            form, has a negative index, or lies outside ``n_layers x n_heads``; the
            message names the item and the accepted forms.
    """
    if isinstance(item, str):
        text = item.strip()
        m = _LABEL.fullmatch(text) or _REFERENCE.fullmatch(text)
        if m is None:
            raise HeadSpecError(f"{what} = {item!r} is not a head; {HEAD_FORMS}")
        lh = (int(m.group(1)), int(m.group(2)))
    else:
        if isinstance(item, (bytes, Mapping)) or not hasattr(item, "__len__") \
                or not hasattr(item, "__getitem__"):
            raise HeadSpecError(f"{what} = {item!r} is not a head; {HEAD_FORMS}")
        try:
            n = len(item)
        except TypeError:  # a 0-d array
            n = -1
        if n != 2:
            raise HeadSpecError(f"{what} = {item!r} is not a head; {HEAD_FORMS}")
        try:
            lh = (as_int(item[0], what), as_int(item[1], what))
        except HeadSpecError:
            raise HeadSpecError(f"{what} = {item!r} is not a head (layer and head must be "
                                f"integers); {HEAD_FORMS}") from None
    return _check_range(lh, what, n_layers, n_heads)


def parse_heads(
    heads: Any,
    model: Any = None,
    *,
    n_layers: int | None = None,
    n_heads: int | None = None,
    what: str = "heads",
    unique: bool = False,
) -> list[Head]:
    """A collection of heads, each in any accepted form, as ``(layer, head)`` pairs.

    Order is kept (a ranking stays a ranking); an empty collection gives ``[]``.

    Args:
        heads: a list (tuple, set, iterator) of heads, e.g. ``[(14, 3), "L20H1", "7-0"]``.
        model: a TransformerBridge; its ``cfg.n_layers`` / ``cfg.n_heads`` bound the
            indices (overridden by explicit ``n_layers`` / ``n_heads``).
        n_layers, n_heads: the geometry to check against, when there is no model.
        what: how the argument is named in error messages (``"heads"``,
            ``"head_sets['locos']"``, ...).
        unique: refuse a head listed twice (a ranking must not repeat a head).

    Returns:
        ``[(layer, head), ...]`` as Python ints.

    Raises:
        HeadSpecError: ``heads`` is not a collection of heads (None, a bare string, a
            single pair, a :class:`~locos_tl.HeadScores`, a dict), or one item is
            malformed or out of range; the message names the item, its position and the
            accepted forms.
    """
    if model is not None:
        L, H = model_dims(model)
        n_layers = L if n_layers is None else n_layers
        n_heads = H if n_heads is None else n_heads
    hint = f"{what} must be a list of heads such as [(1, 2), 'L3H0']"
    if heads is None:
        raise HeadSpecError(f"{hint}, got None")
    if isinstance(heads, (str, bytes)):
        raise HeadSpecError(f"{hint}, got the string {heads!r} (wrap one head in a list: "
                            f"[{heads!r}]); {HEAD_FORMS}")
    if hasattr(heads, "ranked") and hasattr(heads, "top_k"):
        raise HeadSpecError(f"{hint}, got a HeadScores; pass a ranking such as "
                            "scores.top_k(10)")
    if isinstance(heads, Mapping) or not isinstance(heads, Iterable):
        raise HeadSpecError(f"{hint}, got {type(heads).__name__} {heads!r}")
    items = list(heads)
    if len(items) == 2 and not isinstance(heads, (set, frozenset)):
        try:
            pair = (as_int(items[0], what), as_int(items[1], what))
        except HeadSpecError:
            pair = None
        if pair is not None:
            raise HeadSpecError(f"{hint}, got a single pair {tuple(heads)!r}; to name one "
                                f"head write [{pair}]")
    out: list[Head] = []
    seen: set[Head] = set()
    for i, item in enumerate(items):
        lh = parse_head(item, n_layers=n_layers, n_heads=n_heads, what=f"{what}[{i}]")
        if unique and lh in seen:
            raise HeadSpecError(f"{what}[{i}]: head {lh} is listed twice")
        seen.add(lh)
        out.append(lh)
    return out


def parse_head_list(
    text: str, *, n_layers: int | None = None, n_heads: int | None = None,
    what: str = "heads",
) -> list[Head]:
    """Comma-separated heads, as typed on a command line: ``"L14H3,20-1"``.

    Raises:
        HeadSpecError: an empty list or a malformed part (see :func:`parse_head`).
    """
    parts = [p.strip() for p in str(text).split(",")]
    if not any(parts):
        raise HeadSpecError(f"{what} = {text!r} names no head; {HEAD_FORMS}")
    return parse_heads(parts, n_layers=n_layers, n_heads=n_heads, what=what)


def parse_ks(
    k: Any, *, n_total: int | None = None, what: str = "k", allow_zero: bool = False,
    allow_empty: bool = False,
) -> list[int]:
    """Head counts ``k`` (one int or a list of ints) as a sorted list without repeats.

    Args:
        k: ``5`` or ``[1, 5, 10]``.
        n_total: the model's number of heads (``n_layers * n_heads``); each ``k`` must be
            at most this.
        what: how the argument is named in error messages (``"k"``, ``"--k"``).
        allow_zero: accept ``k = 0`` (no head).
        allow_empty: accept an empty list (then ``[]``).

    Raises:
        HeadSpecError: no value (unless ``allow_empty``); a value that is not an
            integer, below 1 (0 with ``allow_zero``), or above ``n_total``; the message
            lists the valid range.
    """
    lo = 0 if allow_zero else 1
    rng = f"in {lo}..{n_total}" if n_total is not None else f">= {lo}"
    if isinstance(k, (str, bytes)) or k is None:
        raise HeadSpecError(f"{what} must be an int or a list of ints {rng}, got {k!r}")
    values = [k] if not isinstance(k, Iterable) else list(k)
    if not values and not allow_empty:
        raise HeadSpecError(f"{what} names no head count; give at least one k {rng}")
    out = []
    for v in values:
        n = as_int(v, what)
        if n < lo:
            extra = "" if allow_zero else (" (k=0, no ablation, is always run as the "
                                           "'baseline' row)")
            raise HeadSpecError(f"{what} = {n} is out of range: each k must be {rng}{extra}")
        if n_total is not None and n > n_total:
            raise HeadSpecError(f"{what} = {n} is more heads than the model has: each k "
                                f"must be {rng} (the model's n_layers x n_heads)")
        out.append(n)
    return sorted(set(out))
