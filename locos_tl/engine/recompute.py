"""Per-layer recomputation (activation checkpointing) for a backward over a long prompt.

A backward through a whole forward keeps every layer's activations until it reaches
that layer: MLP inputs and outputs, norms, attention inputs, about 0.6 MB a token on
Gemma-3-270m in float32 (measured: 3.6 GB above the loaded model at 4k tokens).
:func:`checkpointed_layers` wraps each decoder layer of a plain HF model in
``torch.utils.checkpoint`` (non-reentrant): the forward keeps only each layer's inputs
(the residual stream, ``d_model`` values a token a layer) and the backward recomputes
one layer at a time, so memory grows with the prompt at about the residual stream's
rate plus one layer's working set. The gradients are those of the plain backward: the
recomputation repeats the same operations on the same inputs.

A recomputed layer runs its forward a second time, so whatever it does on the side runs
twice too. Two such side effects matter here, and each has its guard:

- a KV cache grows at every call: :func:`frozen_cache` makes each cache layer return
  what an update would (past keys followed by the new ones) without storing it, so the
  recomputed layer sees the keys the first pass saw;
- a hook that records or creates tensors must do so once: a hook sees the second call
  and returns the same value without new bookkeeping (see ``experiments/atp.py``).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint


def frozen_cache(cache: Any) -> Any:
    """``cache`` with every layer's ``update`` made pure: it returns the keys and values a
    real update would return (the cached past, then the new states) and stores nothing.

    For a single forward whose cache is discarded afterwards (a gradient run on top of a
    shared prefix), so that recomputing a layer does not append its keys a second time.
    transformers' dynamic and sliding-window layers grow by concatenation and never
    write in place, so updating a shallow copy of the layer's state at each call gives
    exactly the states an update of the layer itself would.

    Args:
        cache: a ``transformers`` ``DynamicCache`` (its layers hold the prefix).

    Returns:
        The same object, changed in place; use it for one forward only.
    """
    for layer in cache.layers:
        snapshot = copy.copy(layer)

        def update(key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   _snapshot: Any = snapshot, **kwargs: Any) -> Any:
            return type(_snapshot).update(copy.copy(_snapshot), key_states, value_states,
                                          *args, **kwargs)

        layer.update = update
    return cache


@contextmanager
def checkpointed_layers(layers: Iterable[torch.nn.Module]) -> Iterator[None]:
    """Within the block, each module in ``layers`` runs under non-reentrant
    ``torch.utils.checkpoint``: its forward keeps only its inputs for the backward, which
    recomputes it. The modules' own ``forward`` is restored on exit, exception or not.

    Args:
        layers: the decoder layers of a plain HF model (``model.model.layers``).
    """
    wrapped: list[tuple[torch.nn.Module, Any]] = []
    try:
        for layer in layers:
            own = layer.__dict__.get("forward")  # an instance forward (accelerate's hooks)
            wrapped.append((layer, own))
            layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=False)
        yield
    finally:
        for layer, own in wrapped:
            if own is None:
                del layer.forward  # the class's forward shows again
            else:
                layer.forward = own
