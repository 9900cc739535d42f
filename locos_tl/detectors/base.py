"""The detector interface."""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from jaxtyping import Float
from torch import Tensor

from locos_tl.decode import DecodeStep


class Detector:
    """Base class: per-step head values, reduced over steps to a per-trial score.

    Class attributes:
        name: the ``method`` name.
        steps: ``"answer"`` (only answer steps count, mean over them) or ``"all"`` (every
            generated step counts, summed; Wu et al. 2025's copy-paste count).
        needs_phi: whether :meth:`step_value` reads ``DecodeStep.phi``.
    """

    name: ClassVar[str] = ""
    steps: ClassVar[Literal["answer", "all"]] = "answer"
    needs_phi: ClassVar[bool] = False

    def step_value(
        self, step: DecodeStep, needle_span: tuple[int, int]
    ) -> Float[Tensor, "n_layers n_heads"]:
        raise NotImplementedError

    def trial_score(
        self, values: Float[Tensor, "n_steps n_layers n_heads"], answer_steps: list[int]
    ) -> Float[Tensor, "n_layers n_heads"] | None:
        """Per-trial score from the values of every generated step.

        Returns None when the detector has no step to use (no answer step).
        """
        if self.steps == "all":
            return values.sum(0)
        if not answer_steps:
            return None
        return values[torch.as_tensor(answer_steps, dtype=torch.long)].mean(0)

    def used_steps(self, n_steps: int, answer_steps: list[int]) -> list[int]:
        """The steps whose values enter the per-trial score (for step-pooled means)."""
        return list(range(n_steps)) if self.steps == "all" else list(answer_steps)
