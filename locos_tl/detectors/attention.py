"""Attention-only baselines: Wu copy score, HeadKV retrieval-reasoning, attention-spatial.

They read where a head looks (``hook_pattern`` rows), not what it writes
(docs/concepts.md).
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from locos_tl.decode import DecodeStep
from locos_tl.detectors.base import Detector
from locos_tl.kernel import spatial_contrast


def wu_copy_step(
    pattern: Float[Tensor, "n_layers n_heads pos"],
    key_tokens: Int[Tensor, " pos"],
    token: int,
    needle_span: tuple[int, int],
) -> Float[Tensor, "n_layers n_heads"]:
    """Wu et al. 2025 (arXiv 2404.15574) copy-paste hit of one step.

    A head scores ``1/|span|`` when its most-attended key position lies in the span and
    the token there equals the generated token ``y_t``; else 0.
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
    """
    s, e = needle_span
    k = min(e - s, pattern.shape[-1])
    vals, idx = pattern.topk(k, dim=-1)
    inside = (idx >= s) & (idx < e)
    return (vals * inside).sum(-1) / (e - s)


class WuCopy(Detector):
    """Wu copy score: copy-paste hits summed over every generated step, per trial;
    averaged over accepted trials. A head above 0.1 is a "retrieval head"."""

    name = "wu"
    steps = "all"

    def step_value(self, step: DecodeStep, needle_span: tuple[int, int]) -> Tensor:
        return wu_copy_step(step.pattern, step.key_tokens, step.token, needle_span)


class HeadKV(Detector):
    """HeadKV retrieval-reasoning score: :func:`headkv_step` summed over generated steps."""

    name = "headkv"
    steps = "all"

    def step_value(self, step: DecodeStep, needle_span: tuple[int, int]) -> Tensor:
        return headkv_step(step.pattern, needle_span)


class AttentionSpatial(Detector):
    """LOCOS's spatial contrast applied to attention (``phi = alpha``), probability;
    mean over answer steps."""

    name = "attention_spatial"
    steps = "answer"

    def step_value(self, step: DecodeStep, needle_span: tuple[int, int]) -> Tensor:
        return spatial_contrast(step.pattern, needle_span)
