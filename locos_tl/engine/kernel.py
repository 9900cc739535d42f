"""The LOCOS kernel: per-position logit contributions ``phi`` and the spatial contrast.

Pure tensor functions (no model, no hooks). Source: Gema, Alex & Minervini 2026,
"Logit-Contribution Scoring Identifies Non-Literal Retrieval Heads", arXiv 2607.01002,
Eq. 2 (phi) and Eq. 3 (spatial contrast).

For one answer step (one query row) and one layer::

    phi[h, j] = alpha[h, j] * u_y . (v[g(h), j] @ W_O[h])       (Eq. 2)
              = alpha[h, j] * (v[g(h), j] . w[h]),   w[h] = W_O[h] @ u_y

so the unembedding direction is projected onto each head's value space first
(``O(H * d_head * d_model)``) and the position axis costs ``O(H * N * d_head)``; no
``N x N`` tensor is formed. Grouped-query attention: query head ``h`` reads kv head
``h // (H // H_kv)``.
"""

from __future__ import annotations

import torch
from einops import einsum, rearrange
from jaxtyping import Float
from torch import Tensor


def head_value_directions(
    W_O: Float[Tensor, "n_heads d_head d_model"],
    u: Float[Tensor, " d_model"],
) -> Float[Tensor, "n_heads d_head"]:
    """``w[h] = W_O[h] @ u``: the direction in head ``h``'s value space that raises logit ``u``.

    Args:
        W_O: one layer's output weights, ``[n_heads, d_head, d_model]``.
        u: an unembedding direction (e.g. ``W_U[:, y]``), ``[d_model]``; logits per unit.

    Returns:
        ``[n_heads, d_head]``: a value vector ``v`` moved by head ``h`` adds ``v . w[h]``
        logits to ``u``.
    """
    return einsum(W_O, u, "head d_head d_model, d_model -> head d_head")


def value_logits(
    v: Float[Tensor, "pos n_kv_heads d_head"],
    w: Float[Tensor, "n_heads d_head"],
) -> Float[Tensor, "n_heads pos"]:
    """``v[g(h), j] . w[h]``: logits head ``h`` would write if it attended only to ``j``.

    GQA: ``n_heads`` must be a multiple of ``n_kv_heads``; head ``h`` reads kv head
    ``h // (n_heads // n_kv_heads)`` (the grouping of Hugging Face ``repeat_kv``).

    Raises:
        ValueError: ``n_heads`` is not a multiple of ``n_kv_heads``.
    """
    n_heads, n_kv = w.shape[0], v.shape[1]
    if n_heads % n_kv:
        raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv}")
    w_grouped = rearrange(w, "(kv group) d_head -> kv group d_head", kv=n_kv)
    out = einsum(v, w_grouped, "pos kv d_head, kv group d_head -> kv group pos")
    return rearrange(out, "kv group pos -> (kv group) pos")


def phi_from_pattern(
    pattern: Float[Tensor, "n_heads pos"],
    v: Float[Tensor, "pos n_kv_heads d_head"],
    W_O: Float[Tensor, "n_heads d_head d_model"],
    u: Float[Tensor, " d_model"],
) -> Float[Tensor, "n_heads pos"]:
    """LOCOS per-position logit contributions of one layer's heads for one query (Eq. 2),
    from the query's attention row and the values (no model: the forward pass that gives
    them is :func:`locos_tl.engine.phi.phi_from_model`'s or the decoder's).

    Args:
        pattern: attention row of the query, ``hook_pattern[b, :, q, :]``; probability.
        v: values of the same key positions, ``hook_v[b]``, grouped kv heads.
        W_O: the layer's output weights.
        u: the answer token's (possibly norm-scaled) unembedding direction.

    Returns:
        ``phi[h, j]`` in logits; ``phi.sum(-1)`` is head ``h``'s direct write onto ``u``.
    """
    w = head_value_directions(W_O.to(torch.float32), u.to(torch.float32))
    return pattern.to(torch.float32) * value_logits(v.to(torch.float32), w)


def spatial_contrast(
    phi: Float[Tensor, "... pos"],
    needle_span: tuple[int, int],
) -> Float[Tensor, ...]:
    """LOCOS spatial contrast (Eq. 3): needle mass minus rescaled off-needle mass.

    ``Phi_plus = sum_{j in [s,e)} phi[j]``; ``Phi_minus = n/(N-n) * sum_{j not in [s,e)}
    phi[j]`` with ``n = e - s`` and ``N`` the key length (every non-needle position
    counts, including template, question and earlier generated tokens).

    Args:
        phi: contributions (or attention for the attention-spatial baseline) over the
            ``N`` key positions of one step; any leading axes.
        needle_span: ``(s, e)``, end exclusive, ``0 <= s < e <= N``.

    Returns:
        ``Phi_plus - Phi_minus``, same units as ``phi``. 0 when ``phi`` is uniform.

    Raises:
        ValueError: the span is empty, outside the keys, or covers every key.
    """
    s, e = needle_span
    N = phi.shape[-1]
    n = e - s
    if not (0 <= s < e <= N):
        raise ValueError(f"needle span [{s}, {e}) is not inside {N} key positions")
    if n == N:
        raise ValueError("needle span covers every key position; the contrast is undefined")
    plus = phi[..., s:e].sum(-1)
    minus = (phi.sum(-1) - plus) * (n / (N - n))
    return plus - minus
