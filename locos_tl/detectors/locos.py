"""Write-aware detectors: LOCOS and direct logit attribution."""

from __future__ import annotations

from jaxtyping import Float
from torch import Tensor

from locos_tl.detectors.base import Detector
from locos_tl.engine.decode import DecodeStep
from locos_tl.engine.kernel import spatial_contrast


class Locos(Detector):
    """LOCOS (Gema, Alex & Minervini 2026, arXiv 2607.01002, Eq. 2-3).

    Step value: ``contrast[t] = Phi_plus[t] - Phi_minus[t]`` of ``phi`` (logits);
    per-trial score: mean over answer steps. Positive: the head writes the answer from
    the needle; negative: its answer-directed writing comes mostly from elsewhere.
    Span: the whole needle sentence (authors' release, also on NIAH); acceptance: the
    ROUGE-1 gate and at least one answer step.
    """

    name = "locos"
    steps = "answer"
    needs_phi = True
    span = "needle"

    def step_value(
        self, step: DecodeStep, needle_span: tuple[int, int]
    ) -> Float[Tensor, "n_layers n_heads"]:
        return spatial_contrast(step.phi, needle_span)


class DLA(Detector):
    """Direct logit attribution baseline (arXiv 2607.01002, Sec. 4): ``sum_j phi[j]``
    (logits) over every key position, no spatial contrast; mean over answer steps.
    Write-aware but not spatial (docs/concepts.md); it reads no span (declared
    ``"needle"``, the authors' choice for it on NIAH)."""

    name = "dla"
    steps = "answer"
    needs_phi = True
    span = "needle"

    def step_value(
        self, step: DecodeStep, needle_span: tuple[int, int]
    ) -> Float[Tensor, "n_layers n_heads"]:
        return step.phi.sum(-1)
