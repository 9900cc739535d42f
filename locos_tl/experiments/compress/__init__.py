"""Head-level KV-cache compression guided by head rankings."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from locos_tl.experiments.compress.budgets import Budgets, kv_budgets
    from locos_tl.experiments.compress.cache import (
        CompressedCache,
        compress_cache,
        context_capacity,
    )
    from locos_tl.experiments.compress.fractions import check_fractions
    from locos_tl.experiments.compress.generate import CompressedResult, compressed_generate
    from locos_tl.experiments.compress.sweep import compression_sweep

# imported on first use: ``locos_tl.experiments.compress.fractions`` (and ``budgets``) load without
# torch, so the CLI can check its options before anything heavy is imported
_WHERE = {
    "Budgets": "budgets", "kv_budgets": "budgets",
    "CompressedCache": "cache", "compress_cache": "cache", "context_capacity": "cache",
    "check_fractions": "fractions",
    "CompressedResult": "generate", "compressed_generate": "generate",
    "compression_sweep": "sweep",
}

__all__ = [
    "Budgets",
    "CompressedCache",
    "CompressedResult",
    "check_fractions",
    "compress_cache",
    "compressed_generate",
    "compression_sweep",
    "context_capacity",
    "kv_budgets",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
