"""HeadKV head scores, two forms computed in one decode pass (docs/concepts.md).

- ``headkv``: HeadKV's retrieval-reasoning score as published (Fu et al. 2025, "Not
  All Heads Matter", arXiv 2410.19258, Sec. 3.1, and its released
  ``retrieval_head_detection_r2.py``): decode as many tokens as the gold answer has
  (as the model writes it after the prompt: :func:`headkv_n_steps`), keep the trial
  when the QA-F1 of that response exceeds 0.5, and at each of those steps add
  ``alpha / |span|`` for each of the top-``|span|`` attended positions that lies inside
  the span (no token match); the span is the answer part (``real_needle``).
- ``headkv_anchor``: the anchor-window variant of the LOCOS release (Gema, Alex &
  Minervini 2026, arXiv 2607.01002, reference implementation): prompt only (no
  generated token, no gate); for each of the last 8 prompt positions take the
  attention mass on the needle; the head's per-trial score is the maximum over that
  window.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from jaxtyping import Float
from torch import Tensor

from locos_tl.detectors.attention import headkv_step
from locos_tl.detectors.base import Detector, TrialOutcome
from locos_tl.engine.answers import token_f1
from locos_tl.engine.continuation_tokens import continuation_token_ids
from locos_tl.engine.decode import DecodeStep

#: Last prompt positions read by the anchor variant (the LOCOS release's window).
ANCHOR_WINDOW = 8


def headkv_n_steps(tokenizer: object, answer: str, *, context: str | None = None,
                   prefix: str = "") -> int:
    """How many tokens HeadKV decodes: the length of the gold answer tokenized without
    special tokens.

    Without ``context``, the answer on its own (the released code's
    ``enc.encode(answer, add_special_tokens=False)``). With it, ``prefix + answer`` as
    the tokenizer writes it right after ``context``
    (:func:`~locos_tl.engine.continuation_tokens.continuation_token_ids`): the same
    length on byte-level BPE (SmolLM2, Qwen, Llama-3) after a chat turn, but not on a
    SentencePiece-style tokenizer that marks the start of a text (``▁Chiara`` on its
    own, ``Chiara`` after ``"<|assistant|>\\n"``; the counts can differ), nor after a
    completion template (``prefix=" "``: the model writes `` Chiara``).
    """
    if context is None:
        return len(tokenizer.encode(answer, add_special_tokens=False))  # type: ignore[attr-defined]
    return len(continuation_token_ids(tokenizer, [prefix + answer], context=context)[0])


class HeadKV(Detector):
    """HeadKV retrieval-reasoning score as published (Fu et al. 2025, arXiv 2410.19258).

    Per trial: :func:`~locos_tl.detectors.attention.headkv_step` (probability per span
    token) summed over the first ``n`` generated steps, ``n`` = the gold answer's token
    count (their decode loop stops there; the greedy prefix of a longer decode is the
    same, so it shares the LOCOS pass), counted as the model writes the answer after
    the prompt (:func:`headkv_n_steps` with the outcome's ``context``). Acceptance:
    token-level QA-F1 (LongBench normalisation) of those ``n`` decoded tokens against
    the gold answer exceeds the gate threshold (0.5; their ``qa_f1_score * 100 > 50``),
    no answer-step requirement; a failing trial is dropped as ``"gate"``. Span: the
    answer part (their ``find_needle_idx(real_needle)``). Head score: mean over
    accepted trials.
    """

    name = "headkv"
    steps = "all"
    span = "answer"

    def step_value(self, step: DecodeStep, needle_span: tuple[int, int]) -> Tensor:
        return headkv_step(step.pattern, needle_span)

    def used_steps(self, outcome: TrialOutcome) -> list[int]:
        """The first ``n`` generated steps (after a thinking block, when there is one)."""
        n = headkv_n_steps(outcome.tokenizer, outcome.answer, context=outcome.context,
                           prefix=outcome.answer_prefix)
        a = outcome.response_start
        return list(range(a, min(a + n, len(outcome.generated))))

    def response_prefix(self, outcome: TrialOutcome) -> str:
        """The response HeadKV gates on: the used steps' tokens, decoded and stripped."""
        ids = [outcome.generated[i] for i in self.used_steps(outcome)]
        return outcome.tokenizer.decode(ids, skip_special_tokens=True).strip()

    def drop_reason(self, outcome: TrialOutcome) -> str | None:
        f1 = token_f1(self.response_prefix(outcome), outcome.answer)
        return None if f1 > outcome.gate_threshold else "gate"


def anchor_mass(
    rows: Float[Tensor, "... pos"], needle_span: tuple[int, int]
) -> Float[Tensor, ...]:
    """Attention mass of each row on the span ``[s, e)`` (probability).

    Raises:
        ValueError: the span is empty or outside the rows' key positions.
    """
    s, e = needle_span
    if not 0 <= s < e <= rows.shape[-1]:
        raise ValueError(f"span [{s}, {e}) is not inside {rows.shape[-1]} key positions")
    return rows[..., s:e].sum(-1)


class HeadKVAnchor(Detector):
    """Anchor-window HeadKV variant of the LOCOS release (arXiv 2607.01002 reference
    implementation; docs/concepts.md protocol table).

    Per trial: ``max over q in the last 8 prompt positions of sum_{j in span}
    alpha[q, j]`` (probability). Prompt rows only: no generated token enters, and every
    trial counts (no gate, no answer step). Positions ``N-8 .. N-2`` come from the
    prefill (``greedy_decode(prompt_window=8)``), position ``N-1`` from decoding step
    0, whose query is the last prompt token. Span: the whole needle.
    """

    name = "headkv_anchor"
    steps = "prompt"
    span = "needle"
    prompt_window: ClassVar[int] = ANCHOR_WINDOW

    def step_value(self, step: DecodeStep, needle_span: tuple[int, int]) -> Tensor:
        return anchor_mass(step.pattern, needle_span)

    def prompt_value(
        self, rows: Float[Tensor, "n_heads n_rows pos"], needle_span: tuple[int, int]
    ) -> Float[Tensor, "n_heads n_rows"]:
        keep = max(rows.shape[1] - (self.prompt_window - 1), 0)  # rows before N-1
        return anchor_mass(rows[:, keep:], needle_span)

    def drop_reason(self, outcome: TrialOutcome) -> str | None:
        return None

    def trial_score(
        self,
        values: Float[Tensor, "n_used n_layers n_heads"],
        prompt_values: Float[Tensor, "n_layers n_heads n_rows"] | None = None,
    ) -> Float[Tensor, "n_layers n_heads"] | None:
        """Max over the window: the prompt rows' masses and step 0's (last position)."""
        parts = [values[:1].permute(1, 2, 0)]  # [L, H, 1]
        if prompt_values is not None and prompt_values.shape[-1]:
            parts.insert(0, prompt_values.to(values.dtype))
        return torch.cat(parts, -1).amax(-1)
