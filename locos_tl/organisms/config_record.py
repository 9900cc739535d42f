"""Resume checks of the training loops: whether a recorded configuration (a checkpoint's)
is the one asked for now, field by field (:func:`changed_fields`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def changed_fields(recorded: Mapping[str, Any], now: Mapping[str, Any],
                   defaults: Mapping[str, Any], predating: Mapping[str, Any],
                   ) -> dict[str, tuple[Any, Any]]:
    """The fields where the configuration ``now`` differs from a ``recorded`` one.

    A field the record lacks (added after it was written) counts as ``predating[field]``,
    the behaviour runs had before the field existed, which is not always the field's
    current default; a field absent from ``predating`` counts as ``defaults[field]``.

    Args:
        recorded: the recorded configuration (JSON values).
        now: the configuration asked for, in the same JSON form.
        defaults: the configuration class's defaults, in the same JSON form.
        predating: old behaviours of fields added later.

    Returns:
        ``{field: (recorded value, value now)}``; empty when the two are the same run.
    """
    full = {**defaults, **predating, **recorded}
    return {k: (full.get(k), v) for k, v in now.items() if full.get(k) != v}


def describe_changes(changes: Mapping[str, tuple[Any, Any]]) -> str:
    """``"lr (recorded 0.01, now 0.02), ..."``: the fields of :func:`changed_fields`, for
    the error that refuses to resume."""
    return ", ".join(f"{k} (recorded {a!r}, now {b!r})" for k, (a, b) in changes.items())
