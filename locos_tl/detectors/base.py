"""The detector interface: per-step values, per-method span, acceptance and reduction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from jaxtyping import Float
from torch import Tensor

from locos_tl.engine.decode import DecodeStep

SpanName = Literal["needle", "answer"]
SPAN_NAMES: tuple[str, ...] = ("needle", "answer")


@dataclass(frozen=True)
class TrialOutcome:
    """One decoded trial as the detectors see it when they accept and reduce it.

    Attributes:
        generated: greedy token ids (the stop token included).
        response: decoded response text (stop token excluded, stripped).
        answer: the trial's gold answer.
        rouge1_recall: ROUGE-1 recall of ``response`` against ``answer``.
        answer_steps: 0-based answer steps (``locos_tl.engine.answers.answer_steps``).
        gate_threshold: a gate passes when its score exceeds this (0.5).
        tokenizer: the model's tokenizer (HeadKV decodes a prefix of the response).
        response_start: index in ``generated`` of the first step after a thinking
            block (0 without one).
        context: the text the response continues (the prompt text, then the thinking
            block's tokens decoded), for tokenizing the answer as the model writes it
            (:func:`~locos_tl.engine.continuation_tokens.continuation_token_ids`);
            None: unknown (the answer is tokenized on its own).
        answer_prefix: what precedes the answer at the answer position (``" "`` after a
            completion template:
            :func:`~locos_tl.engine.continuation_tokens.answer_prefix`); read with
            ``context`` only.
    """

    generated: list[int]
    response: str
    answer: str
    rouge1_recall: float
    answer_steps: list[int]
    gate_threshold: float
    tokenizer: Any = None
    response_start: int = 0
    context: str | None = None
    answer_prefix: str = ""


class Detector:
    """Base class: per-step head values, reduced over the used steps to a per-trial score.

    Class attributes:
        name: the ``method`` name.
        steps: ``"answer"`` (only answer steps count, mean over them), ``"all"`` (every
            generated step counts, summed; Wu et al. 2025's copy-paste count) or
            ``"prompt"`` (only the prompt: the attention rows of its last positions).
        needs_phi: whether :meth:`step_value` reads ``DecodeStep.phi``.
        span: the trial span the detector reads by default, following its published
            protocol: ``"needle"`` (the whole needle sentence) or ``"answer"`` (the
            answer part, NIAH ``real_needle``); see :meth:`locos_tl.trials.Trial.span`.
            An instance may override it (``Detector(span="answer")``).
        prompt_window: how many last prompt positions' attention rows the detector
            reads (0: none).

    Args:
        span: override of the class's ``span``.

    Raises:
        ValueError: ``span`` is not ``"needle"`` or ``"answer"``.
    """

    name: ClassVar[str] = ""
    steps: ClassVar[Literal["answer", "all", "prompt"]] = "answer"
    needs_phi: ClassVar[bool] = False
    span: SpanName = "needle"
    prompt_window: ClassVar[int] = 0

    def __init__(self, span: str | None = None) -> None:
        if span is not None:
            if span not in SPAN_NAMES:
                raise ValueError(f"{self.name}: unknown span {span!r}; use 'needle' or 'answer'")
            self.span = span  # type: ignore[assignment]

    def step_value(
        self, step: DecodeStep, needle_span: tuple[int, int]
    ) -> Float[Tensor, "n_layers n_heads"]:
        """The step's per-head value; ``needle_span`` is the detector's span."""
        raise NotImplementedError

    def prompt_value(
        self, rows: Float[Tensor, "n_heads n_rows pos"], needle_span: tuple[int, int]
    ) -> Float[Tensor, "n_heads n_rows"]:
        """Per-head values of one layer's prompt rows (``prompt_window`` detectors)."""
        raise NotImplementedError

    def drop_reason(self, outcome: TrialOutcome) -> str | None:
        """Why this method does not count the trial (``None``: it counts).

        Default (LOCOS protocol, arXiv 2607.01002 Sec. 3): ``"gate"`` when the ROUGE-1
        recall is at most the threshold; for answer-step methods also
        ``"no_answer_step"`` when the answer was not found in the generated ids.
        """
        if outcome.rouge1_recall <= outcome.gate_threshold:
            return "gate"
        if self.steps == "answer" and not outcome.answer_steps:
            return "no_answer_step"
        return None

    def used_steps(self, outcome: TrialOutcome) -> list[int]:
        """The steps whose values enter the per-trial score (for step-pooled means)."""
        if self.steps == "all":
            return list(range(len(outcome.generated)))
        if self.steps == "prompt":
            return [0]  # step 0's query is the last prompt position
        return list(outcome.answer_steps)

    def trial_score(
        self,
        values: Float[Tensor, "n_used n_layers n_heads"],
        prompt_values: Float[Tensor, "n_layers n_heads n_rows"] | None = None,
    ) -> Float[Tensor, "n_layers n_heads"] | None:
        """Per-trial score from the values of the used steps (:meth:`used_steps`):
        their sum for ``steps="all"``, their mean otherwise; None with no used step."""
        if values.shape[0] == 0:
            return None
        return values.sum(0) if self.steps == "all" else values.mean(0)
