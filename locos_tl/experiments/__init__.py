"""The experiments: scoring, ablation, activation patching, KV-cache compression."""

from __future__ import annotations

from typing import Any

__all__ = ["paired_tests"]


def __getattr__(name: str) -> Any:
    # lazy, so importing one experiment module does not load scipy's tests
    if name == "paired_tests":
        from locos_tl.experiments.stats import paired_tests

        return paired_tests
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
