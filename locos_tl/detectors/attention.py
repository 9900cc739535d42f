"""Attention-only baselines: Wu copy score, attention-spatial (HeadKV: :mod:`.headkv`).

They read where a head looks (``hook_pattern`` rows), not what it writes
(docs/concepts.md, protocol table).
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from locos_tl.detectors.base import Detector
from locos_tl.engine.decode import DecodeStep
from locos_tl.engine.kernel import spatial_contrast


def wu_copy_step(
    pattern: Float[Tensor, "n_layers n_heads pos"],
    key_tokens: Int[Tensor, " pos"],
    token: int,
    needle_span: tuple[int, int],
) -> Float[Tensor, "n_layers n_heads"]:
    """Wu et al. 2025 (arXiv 2404.15574) copy-paste hit of one step.

    A head scores ``1/|span|`` when its most-attended key position lies in the span and
    the token there equals the generated token ``y_t``; else 0.

    Args:
        pattern: attention rows of the step's query (probability).
        key_tokens: ids of the key positions.
        token: the step's greedy token ``y_t``.
        needle_span: ``(s, e)``, end exclusive (the NIAH ``real_needle`` part by default).

    Returns:
        ``[n_layers, n_heads]`` hit values, 0 or ``1/(e - s)``.
    """
    s, e = needle_span
    top = pattern.argmax(-1)
    in_span = (top >= s) & (top < e)
    match = key_tokens.to(top.device)[top] == token
    return (in_span & match).to(torch.float32) / (e - s)


def headkv_step(
    pattern: Float[Tensor, "n_layers n_heads pos"], needle_span: tuple[int, int]
) -> Float[Tensor, "n_layers n_heads"]:
    """HeadKV retrieval-reasoning mass of one step (Fu et al. 2025, arXiv 2410.19258).

    Among the ``|span|`` most-attended positions, sum the attention of those inside the
    span, divided by ``|span|`` (no token match); probability per span token.

    Args:
        pattern: attention rows of the step's query (probability).
        needle_span: ``(s, e)``, end exclusive.

    Returns:
        ``[n_layers, n_heads]``, in ``[0, 1/(e - s)]``.
    """
    s, e = needle_span
    k = min(e - s, pattern.shape[-1])
    vals, idx = pattern.topk(k, dim=-1)
    inside = (idx >= s) & (idx < e)
    return (vals * inside).sum(-1) / (e - s)


class WuCopy(Detector):
    """Wu copy score (Wu et al. 2025, arXiv 2404.15574, Sec. 2; their released
    ``retrieval_head_detection.py``).

    Per trial: :func:`wu_copy_step` summed over every generated step (the stop token's
    step included, as in their decode loop); head score: mean over accepted trials; a
    head above 0.1 is a "retrieval head". Span: the answer part (NIAH ``real_needle``).
    Acceptance as published: every trial whose ROUGE-1 recall exceeds the gate counts,
    with no answer-step requirement (their gate is recall against ``real_needle``,
    which is the trial's gold answer for NIAH trials).
    """

    name = "wu"
    steps = "all"
    span = "answer"

    def step_value(self, step: DecodeStep, needle_span: tuple[int, int]) -> Tensor:
        return wu_copy_step(step.pattern, step.key_tokens, step.token, needle_span)


class AttentionSpatial(Detector):
    """Attention-spatial baseline (Gema, Alex & Minervini 2026, arXiv 2607.01002, Sec. 4):
    LOCOS's spatial contrast (Eq. 3) applied to attention (``phi = alpha``),
    probability; mean over answer steps; span: the whole needle (authors' release)."""

    name = "attention_spatial"
    steps = "answer"
    span = "needle"

    def step_value(self, step: DecodeStep, needle_span: tuple[int, int]) -> Tensor:
        return spatial_contrast(step.pattern, needle_span)
