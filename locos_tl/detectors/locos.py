"""Write-aware detectors: LOCOS and direct logit attribution."""

from __future__ import annotations

from jaxtyping import Float
from torch import Tensor

from locos_tl.decode import DecodeStep
from locos_tl.detectors.base import Detector
from locos_tl.kernel import spatial_contrast


class Locos(Detector):
    """LOCOS (Gema, Alex & Minervini 2026, arXiv 2607.01002, Eq. 2-3).

    Step value: ``contrast[t] = Phi_plus[t] - Phi_minus[t]`` of ``phi`` (logits);
    per-trial score: mean over answer steps. Positive: the head writes the answer from
    the needle; negative: its answer-directed writing comes mostly from elsewhere.
    """

    name = "locos"
    steps = "answer"
    needs_phi = True

    def step_value(
        self, step: DecodeStep, needle_span: tuple[int, int]
    ) -> Float[Tensor, "n_layers n_heads"]:
        return spatial_contrast(step.phi, needle_span)


class DLA(Detector):
    """Direct logit attribution baseline: ``sum_j phi[j]`` (logits), no spatial contrast;
    mean over answer steps. Write-aware but not spatial (docs/concepts.md)."""

    name = "dla"
    steps = "answer"
    needs_phi = True

    def step_value(
        self, step: DecodeStep, needle_span: tuple[int, int]
    ) -> Float[Tensor, "n_layers n_heads"]:
        return step.phi.sum(-1)
