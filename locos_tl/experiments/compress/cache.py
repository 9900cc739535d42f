"""A compressed KV cache that really stores only the retained entries, and its attention.

:class:`CompressedCache` is a transformers :class:`~transformers.cache_utils.Cache` whose
layers (:class:`CompressedLayer`, a ``CacheLayerMixin``) hold, per kv group, their own
``[K_g, d_head]`` key and value tensors (ragged lengths ``K_g``) and the absolute
positions of those entries. New tokens (question, generated) are appended to every
group. The attention over it is :func:`compressed_attention`, registered through
transformers' ``AttentionInterface`` under :data:`ATTN_NAME` (the sanctioned extension
point: no model code is forked) by :func:`register_attention`, at the first
:func:`compression_twin` and once only: importing this module changes nothing in
transformers' global registry. It is a loop over kv groups, each attending with its own
keys; the causal and sliding-window rules are applied on the stored absolute positions,
so RoPE (applied by the model from explicit ``position_ids``) keeps the original
positions. Scaling and soft-capping come from the model's own kwargs; the softmax runs
in float32 as HF's eager attention does.

A model runs this attention through a *compression twin*: a plain HF model of the same
class sharing the bridge's weight tensors (:func:`locos_tl.engine.twin.build_twin`) whose
attention implementation is :data:`ATTN_NAME`. The shared fast twins are not touched.

Models with learned attention sinks (GPT-OSS: a learned logit per head, ``module.sinks``,
passed to the attention as ``s_aux``, joins every softmax) are refused: this attention
does not implement them, and their semantics differ between models.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

from locos_tl.errors import LocosError
from locos_tl.experiments.compress.budgets import Budgets

#: the attention implementation name registered with transformers' AttentionInterface
ATTN_NAME = "locos_compressed"
#: the forward kwarg that carries the cache to :func:`compressed_attention`
CACHE_KWARG = "locos_compressed_cache"


class CompressedLayer(CacheLayerMixin):
    """One layer's compressed cache: per kv group its own keys, values and positions.

    Args:
        keys, values: per kv group ``[K_g, d_head]`` tensors (owned, not views).
        positions: per kv group ``[K_g]`` int64 absolute positions, ascending.
        head_keep: per kv group ``[G, K_g]`` bool (query-head unit: which stored
            entries each query head of the group may read) or None (all).
        seen: tokens processed so far (the next token's absolute position).
        sliding_window: the layer's window (a key ``j`` is visible to query ``i`` iff
            ``i - window < j <= i``) or None.
    """

    is_compileable = False
    is_croppable = False

    def __init__(self, keys: list[Tensor], values: list[Tensor], positions: list[Tensor],
                 head_keep: list[Tensor | None], seen: int,
                 sliding_window: int | None = None) -> None:
        super().__init__()
        self.group_keys, self.group_values = keys, values
        self.group_positions, self.head_keep = positions, head_keep
        self.seen = int(seen)
        self.sliding_window = sliding_window
        self.is_sliding = sliding_window is not None
        self.query_positions: Tensor | None = None
        self.is_initialized = True
        if keys:
            self.dtype, self.device = keys[0].dtype, keys[0].device

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        return None

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any,
               **kwargs: Any) -> tuple[Tensor, Tensor]:
        """Append ``[1, n_kv, q, d_head]`` new keys/values to every group (positions
        ``seen .. seen + q - 1``); a sliding layer first drops entries no query from
        now on can see. Returns the inputs (the attention reads the groups)."""
        if key_states.shape[0] != 1:
            raise LocosError("the compressed cache supports batch size 1 only")
        q = key_states.shape[-2]
        new_pos = torch.arange(self.seen, self.seen + q, device=key_states.device)
        for g in range(len(self.group_keys)):
            if self.sliding_window is not None:
                live = self.group_positions[g] > self.seen - self.sliding_window
                if not bool(live.all()):
                    self._select(g, live)
            self.group_keys[g] = torch.cat([self.group_keys[g], key_states[0, g]])
            self.group_values[g] = torch.cat([self.group_values[g], value_states[0, g]])
            self.group_positions[g] = torch.cat([self.group_positions[g], new_pos])
            keep = self.head_keep[g]
            if keep is not None:
                self.head_keep[g] = torch.cat([keep, keep.new_ones(keep.shape[0], q)], dim=1)
        self.query_positions = new_pos
        self.seen += q
        return key_states, value_states

    def _select(self, g: int, mask: Tensor) -> None:
        self.group_keys[g] = self.group_keys[g][mask]
        self.group_values[g] = self.group_values[g][mask]
        self.group_positions[g] = self.group_positions[g][mask]
        if self.head_keep[g] is not None:
            self.head_keep[g] = self.head_keep[g][:, mask]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return -1

    def kv_bytes(self) -> int:
        """Bytes of the stored key and value tensors (``nbytes``, measured)."""
        return sum(k.nbytes + v.nbytes for k, v in zip(self.group_keys, self.group_values,
                                                             strict=True))

    def n_entries(self) -> list[int]:
        """Stored entries per kv group."""
        return [int(k.shape[0]) for k in self.group_keys]


class CompressedCache(Cache):
    """A :class:`~transformers.cache_utils.Cache` of :class:`CompressedLayer` s.

    Attributes:
        retained_entries: retained context entries right after compression, counted
            per unit (per query head for the query-head unit).
        full_entries: context entries of the full cache, in the same units.
        kv_bytes: bytes of the stored context K/V tensors right after compression.
        full_kv_bytes: bytes of the full prefilled cache's K/V tensors.
    """

    def __init__(self, layers: list[CompressedLayer], *, retained_entries: int,
                 full_entries: int, kv_bytes: int, full_kv_bytes: int) -> None:
        super().__init__(layers=layers)
        self.retained_entries = retained_entries
        self.full_entries = full_entries
        self.kv_bytes = kv_bytes
        self.full_kv_bytes = full_kv_bytes

    def stored_kv_bytes(self) -> int:
        """Bytes of every layer's stored K/V tensors now (new tokens included)."""
        return sum(layer.kv_bytes() for layer in self.layers)


def cache_capacity(full: Any, context_len: int) -> np.ndarray:
    """``[n_layers]`` context entries per kv head each layer of a prefilled full cache
    stores: ``context_len``, or the window's last keys on a sliding-window layer.

    Raises:
        LocosError: a layer that is not ``[1, n_kv, K, d_head]`` keys.
    """
    return np.array([_layer_positions(layer, context_len)[2].numel() for layer in full.layers],
                    dtype=np.int64)


def context_capacity(model: Any, context_len: int) -> np.ndarray:
    """``[n_layers]`` context entries per kv head the model's full KV cache stores after
    ``context_len`` tokens (``context_len`` on full-attention layers; a transformers
    sliding-window layer of window ``w`` keeps the last ``w - 1``): the ``capacity`` of
    :func:`~locos_tl.experiments.compress.kv_budgets`. Read from an empty cache of the model's own
    kind, fed ``context_len`` one-number keys (no forward pass).

    Raises:
        LocosError: ``context_len < 1``.
    """
    from transformers import DynamicCache

    if int(context_len) < 1:
        raise LocosError(f"context_len must be >= 1, got {context_len!r}")
    cache = DynamicCache(config=model.original_model.config)
    dummy = torch.zeros(1, 1, int(context_len), 1)
    out = []
    for layer in cache.layers:
        layer.update(dummy, dummy)
        out.append(int(layer.keys.shape[-2]))
    return np.array(out, dtype=np.int64)


def learned_sink_modules(hf_model: Any) -> list[str]:
    """Names of the modules of an HF model that hold learned attention sinks (a tensor
    ``module.sinks``: GPT-OSS and its kin)."""
    return [name for name, m in hf_model.named_modules()
            if isinstance(getattr(m, "sinks", None), Tensor)]


def _sinks_error(where: str) -> LocosError:
    return LocosError(
        f"{where} has learned attention sinks (a learned logit per head in every softmax, "
        "GPT-OSS's s_aux); compressed decoding does not implement them, so such models "
        "are refused")


def _layer_positions(layer: Any, context_len: int) -> tuple[Tensor, Tensor, Tensor]:
    """Keys ``[n_kv, K, d]``, values and absolute positions ``[K]`` of a full cache layer
    (a sliding layer holds the last ``K`` context positions)."""
    k, v = layer.keys, layer.values
    if not isinstance(k, Tensor) or k.ndim != 4 or k.shape[0] != 1:
        raise LocosError(f"cannot compress a cache layer of type {type(layer).__name__} "
                         "(expected [1, n_kv, K, d_head] keys)")
    K = k.shape[-2]
    if not getattr(layer, "is_sliding", False) and K != context_len:
        raise LocosError(f"a full-attention cache layer holds {K} entries for a context "
                         f"of {context_len}")
    pos = torch.arange(context_len - K, context_len, device=k.device)
    return k[0], v[0], pos


@torch.no_grad()
def compress_cache(full: Any, budgets: Budgets, n_heads: int) -> CompressedCache:
    """Copy the retained entries of a prefilled full cache into a :class:`CompressedCache`.

    The full cache is left intact (retained entries are copied with ``index_select``),
    so one prefill serves many budgets. A sliding-window layer holds only its last
    ``window - 1`` context keys; the budgets must know it (their ``capacity``, from
    :func:`context_capacity`), so that every budgeted entry is stored.

    Args:
        full: a transformers ``DynamicCache`` after prefilling the ``P`` context tokens.
        budgets: :class:`Budgets` with ``context_len == P``.
        n_heads: query heads per layer.

    Raises:
        LocosError: layer count, kv-head count, context length or a layer's capacity
            differ from the budgets.
    """
    P = budgets.context_len
    if len(full.layers) != budgets.n_layers:
        raise LocosError(f"the cache has {len(full.layers)} layers, the budgets "
                         f"{budgets.n_layers}")
    layers: list[CompressedLayer] = []
    retained = full_n = kv_bytes = full_bytes = 0
    G = n_heads // budgets.n_kv_heads
    for l, fl in enumerate(full.layers):
        k, v, pos = _layer_positions(fl, P)
        if k.shape[0] != budgets.n_kv_heads:
            raise LocosError(f"layer {l}: the cache has {k.shape[0]} kv heads, the budgets "
                             f"{budgets.n_kv_heads}")
        if pos.numel() != budgets.capacity[l]:
            raise LocosError(
                f"layer {l}'s full cache stores {pos.numel()} context entries per kv head, "
                f"the budgets assume {int(budgets.capacity[l])} (a sliding-window layer "
                "stores only its window): build the budgets with "
                "kv_budgets(..., capacity=context_capacity(model, context_len))")
        full_bytes += k.nbytes + v.nbytes
        stored = pos.cpu().numpy()
        keys, values, positions, keeps = [], [], [], []
        for g in range(budgets.n_kv_heads):
            if budgets.unit == "kv_group":
                want = np.intersect1d(budgets.positions(l, g), stored)
                keep = None
                retained += want.size
                full_n += stored.size
            else:
                sets = [np.intersect1d(budgets.positions(l, h), stored)
                        for h in range(g * G, (g + 1) * G)]
                want = np.unique(np.concatenate(sets)) if sets else np.zeros(0, np.int64)
                keep = torch.tensor(np.stack([np.isin(want, s) for s in sets]),
                                    dtype=torch.bool, device=k.device).reshape(G, want.size)
                retained += sum(s.size for s in sets)
                full_n += G * stored.size
            idx = torch.as_tensor(want - stored[0] if stored.size else want,
                                  dtype=torch.long, device=k.device)
            keys.append(k[g].index_select(0, idx))
            values.append(v[g].index_select(0, idx))
            positions.append(torch.as_tensor(want, dtype=torch.long, device=k.device))
            keeps.append(keep)
            kv_bytes += keys[-1].nbytes + values[-1].nbytes
        window = getattr(fl, "sliding_window", None) if getattr(fl, "is_sliding", False) else None
        layers.append(CompressedLayer(keys, values, positions, keeps, seen=P,
                                      sliding_window=window))
    return CompressedCache(layers, retained_entries=retained, full_entries=full_n,
                           kv_bytes=kv_bytes, full_kv_bytes=full_bytes)


def compressed_attention(
    module: Any,
    query: Float[Tensor, "1 n_heads q d_head"],
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[Float[Tensor, "1 q n_heads d_head"], None]:
    """Attention of the new queries over a :class:`CompressedLayer`, group by group.

    For kv group ``g`` (query heads ``g*G .. g*G + G - 1``): scores ``q_h . k_j *
    scaling`` (soft-capped when ``softcap``), restricted to stored keys ``j`` with
    ``pos_j <= pos_i`` (causal), ``pos_j > pos_i - window`` on a sliding layer, and the
    query head's own retained set (query-head unit); float32 softmax; weighted sum of
    the group's values. ``key``/``value``/``attention_mask`` from the model are ignored:
    the cache passed as ``locos_compressed_cache`` holds the keys.

    Raises:
        LocosError: no compressed cache was passed, batch size > 1, or learned
            attention sinks (``s_aux``, ``module.sinks``), which are not implemented.
    """
    if kwargs.get("s_aux") is not None or isinstance(getattr(module, "sinks", None), Tensor):
        raise _sinks_error(f"attention module {type(module).__name__}")
    cache = kwargs.get(CACHE_KWARG)
    if not isinstance(cache, CompressedCache):
        raise LocosError(f"attention {ATTN_NAME!r} needs a CompressedCache passed as "
                         f"{CACHE_KWARG}= in the forward call")
    layer: CompressedLayer = cache.layers[module.layer_idx]
    B, H, q, d = query.shape
    if B != 1:
        raise LocosError("the compressed cache supports batch size 1 only")
    n_kv = len(layer.group_keys)
    G = H // n_kv
    if scaling is None:
        scaling = module.head_dim ** -0.5
    qpos = layer.query_positions
    out = query.new_empty(1, q, H, layer.group_values[0].shape[-1])
    for g in range(n_kv):
        K, V, kpos = layer.group_keys[g], layer.group_values[g], layer.group_positions[g]
        s = torch.matmul(query[0, g * G : (g + 1) * G], K.transpose(0, 1)) * scaling
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        ok = kpos[None, :] <= qpos[:, None]  # [q, K]
        if layer.sliding_window is not None:
            ok = ok & (kpos[None, :] > qpos[:, None] - layer.sliding_window)
        ok = ok[None]
        if layer.head_keep[g] is not None:
            ok = ok & layer.head_keep[g][:, None, :]  # [G, q, K]
        s = s.masked_fill(~ok, float("-inf"))
        p = torch.softmax(s, dim=-1, dtype=torch.float32).to(query.dtype)
        out[0, :, g * G : (g + 1) * G] = torch.matmul(p, V).transpose(0, 1)
    return out, None


def register_attention() -> None:
    """Register :func:`compressed_attention` with transformers' ``AttentionInterface``
    under :data:`ATTN_NAME` (a global registry of the process), if it is not there yet.

    Idempotent; :func:`compression_twin` calls it before the twin takes the
    implementation, so importing this module registers nothing.
    """
    from transformers import AttentionInterface

    if AttentionInterface().get(ATTN_NAME) is not compressed_attention:
        AttentionInterface.register(ATTN_NAME, compressed_attention)


_TWINS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def compression_twin(model: Any) -> Any:
    """The plain HF twin of ``model`` that runs :func:`compressed_attention` (cached
    per model; it shares the bridge's weight tensors, :func:`locos_tl.engine.twin.build_twin`).
    The first call registers the attention with transformers (:func:`register_attention`).

    Raises:
        LocosError: learned attention sinks (GPT-OSS), or no twin can be built
            (device-mapped model, an architecture HF cannot rebuild); the reason is in the
            message.
    """
    if model in _TWINS:
        return _TWINS[model]
    hf = model.original_model
    sinks = learned_sink_modules(hf)
    if sinks:
        raise _sinks_error(f"{type(hf).__name__} ({sinks[0]}.sinks)")
    from locos_tl.engine.twin import build_twin

    register_attention()
    try:
        twin = build_twin(model, attn_implementation="eager")
        twin.set_attn_implementation(ATTN_NAME)
    except Exception as exc:  # TwinUnavailable or an HF rebuild failure: say why
        raise LocosError(
            f"compressed decoding needs a plain HF twin of the model, which cannot be "
            f"built: {exc}") from exc
    if twin.config._attn_implementation != ATTN_NAME:
        raise LocosError(f"the twin did not take the attention implementation {ATTN_NAME!r}")
    _TWINS[model] = twin
    return twin


def layer_entries(cache: CompressedCache) -> Sequence[list[int]]:
    """Stored entries per layer and kv group (for inspection)."""
    return [layer.n_entries() for layer in cache.layers]
