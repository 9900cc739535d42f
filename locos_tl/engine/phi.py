"""``phi_from_model``: the position-by-head LOCOS contributions of one query, for exploration.

It runs the model (one forward of the prompt and one forced step); the kernel it applies
to each layer's attention row and values is :func:`locos_tl.engine.kernel.phi_from_pattern`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from locos_tl.engine.decode import DecodeStep, greedy_decode
from locos_tl.engine.unembed import AnswerDirections
from locos_tl.errors import NonFiniteError, TrialError


def phi_from_model(
    model: Any,
    tokens: Sequence[int] | Tensor,
    target_token: int,
    *,
    query_pos: int = -1,
    variant: str = "raw",
    return_pattern: bool = False,
) -> Float[Tensor, "n_layers n_heads pos"] | tuple[Tensor, Tensor]:
    """LOCOS ``phi[l, h, j]`` for the query at ``query_pos`` predicting ``target_token``.

    ``phi[l, h, j] = alpha[l, h, q, j] * u . (v[l, g(h), j] @ W_O[l, h])`` (Gema, Alex &
    Minervini 2026, arXiv 2607.01002, Eq. 2), from ``hook_pattern`` and ``hook_v``, for
    every key position ``j <= q``. With ``variant="exact"`` the norm scales are frozen and
    ``phi.sum(-1)`` is each head's direct logit attribution for ``target_token``.

    Args:
        model: a TransformerBridge.
        tokens: token ids ``[pos]`` (a leading batch axis of 1 is accepted).
        target_token: the token whose logit the heads write toward (``y_t``).
        query_pos: the query position (negative counts from the end).
        variant: ``"raw"`` or ``"exact"``.
        return_pattern: also return the attention rows ``[n_layers, n_heads, q + 1]``.

    Returns:
        ``phi`` in logits, ``[n_layers, n_heads, q + 1]`` (and the pattern if asked).

    Raises:
        TrialError: ``query_pos`` outside the tokens, or ``target_token`` outside the
            vocabulary.
        NonFiniteError: the forward pass gave NaN or inf logits, or phi holds NaN or
            inf (a :class:`TrialError`).
        ValueError: unknown variant.
    """
    ids = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
    n = ids.shape[0]
    q = query_pos + n if query_pos < 0 else query_pos
    if not 0 <= q < n:
        raise TrialError(f"query_pos {query_pos} is outside the {n} tokens")
    if not 0 <= int(target_token) < int(model.cfg.d_vocab):
        raise TrialError(f"target token {target_token} outside the vocabulary")
    directions = AnswerDirections(model, variant)
    captured: list[DecodeStep] = []
    greedy_decode(
        model, ids[: q + 1], max_new_tokens=1, forced_tokens=[int(target_token)],
        on_step=captured.append, directions=directions, stop_rule="none",
        stop_at_eos=False,
    )
    step = captured[0]
    if not bool(torch.isfinite(step.phi).all()):
        n_bad = int((~torch.isfinite(step.phi)).sum())
        raise NonFiniteError(
            f"phi holds {n_bad} NaN or inf values of {step.phi.numel()} (model dtype "
            f"{next(model.parameters()).dtype}; an fp16 overflow? try bfloat16 or float32)"
        )
    return (step.phi, step.pattern) if return_pattern else step.phi
