"""Head-level KV-cache compression guided by head rankings (issue 13, part 2).

Protocol (query-agnostic context compression). A trial's prompt is split at
``query_start`` (the question; organism trials carry it in ``meta["query_start"]``).
The context ``[0, query_start)`` is prefilled with the normal full KV cache; the cache
is then compressed per *unit* without looking at the question; the question tokens run
through the compressed cache and greedy decoding continues with it (new tokens are
always kept), under the project's stop rules.

Units. ``"kv_group"``: the query heads sharing one kv head (GQA) share one stored
cache, so eviction is per group and real; a group's score is the max of its query
heads' scores (a group must keep its cache if any head reading it retrieves; ``"sum"``
is offered). ``"query_head"``: the exact variant, each query head with its own retained
set, applied as a mask over its group's stored cache; entries are counted per query
head and memory is freed only where every head of a group drops an entry.

Allocation (:func:`kv_budgets`). Every unit keeps ``sinks`` first + ``min_recent`` last
context positions; the total is ``fraction`` of the context entries the full cache
stores (a sliding-window layer stores only its window, :func:`context_capacity`; no
unit is given more than its layer stores):
``"greedy"`` (units in rank order keep the full cache until the budget runs out, the
marginal unit a longer recent window, the rest the floor), ``"proportional"`` (HeadKV,
Fu et al. 2025, arXiv 2410.19258 Sec. 3.2: a base per unit plus a pool shared by score,
capped at the context with water-filling) or ``"uniform"``. A partial unit keeps its
sinks and most recent positions (StreamingLLM style; no SnapKV token selection).

Measured. Per decode (:class:`CompressedResult`): the tokens and response, whether the
first response token is the answer's first token (``first_token_correct``) and whether
the answer string occurs (``answer_correct``), retained and full context entries, and
``kv_bytes`` / ``full_kv_bytes`` from the ``nbytes`` of the stored K/V tensors right
after compression. :func:`compression_sweep` gives a tidy frame over rankings
(scores, ``"uniform"``, seeded ``"random"``), fractions and trials, one prefill per
trial. Implementation: a custom transformers ``Cache`` with ragged per-group tensors and
an attention function registered through ``AttentionInterface``
(:mod:`locos_tl.experiments.compress.cache`), run on a plain HF twin sharing the bridge's weights.
"""

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
