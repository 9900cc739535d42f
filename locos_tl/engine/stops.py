"""Stop and thinking rules of greedy decoding, and the :class:`DecodeResult` they produce.

When a decode stops (an end-of-sequence token, a newline as the stop rule defines it,
or ``max_new_tokens``), which generated tokens belong to a ``<think> ... </think>``
block (never answer steps, never a stop), and which text is the response. One set of
rules, :class:`StopRules`, decides every token alike in the one greedy loop
(:func:`locos_tl.engine.greedy.greedy_loop`) that :func:`locos_tl.engine.decode.greedy_decode`,
the batched scorer (:mod:`locos_tl.runs.batch`) and the compressed decode
(:mod:`locos_tl.experiments.compress`) drive.

The default stop rule ``"newline_token"`` is the authors' release (docs/concepts.md
protocol table; Gema, Alex & Minervini 2026, arXiv 2607.01002).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from locos_tl.engine.answers import scan_think, think_token_ids
from locos_tl.engine.forward import hf_model
from locos_tl.engine.options import STOP_RULES, StopRule, check_stop_rule

__all__ = ["STOP_RULES", "DecodeResult", "StopRule", "StopRules", "StopState", "check_stop_rule",
           "is_newline_stop", "stop_predicate"]


def is_newline_stop(text: str, rule: str = "newline_token") -> bool:
    """Whether a generated token whose decoded text is ``text`` stops decoding.

    ``"newline_token"`` (default; the authors' release, docs/concepts.md protocol table,
    Gema, Alex & Minervini 2026, arXiv 2607.01002): only the bare newline token, whose
    text is exactly ``"\\n"`` (also what the byte-fallback token ``<0x0A>`` decodes
    to); a token that merely contains a newline (``".\\n"``, ``"\\n\\n"``) does not
    stop. ``"contains_newline"`` (this project's earlier rule): any token whose text
    contains ``"\\n"``. ``"none"``: no token stops (multi-line answers, MuSiQue).

    Raises:
        ValueError: unknown rule.
    """
    if rule == "newline_token":
        return text == "\n"
    if rule == "contains_newline":
        return "\n" in text
    if rule == "none":
        return False
    raise ValueError(f"unknown stop rule {rule!r}; use one of {STOP_RULES}")

@dataclass
class DecodeResult:
    """Output of :func:`locos_tl.engine.decode.greedy_decode`.

    Attributes:
        prompt_len: prompt tokens ``N``.
        generated: generated ids, the stop token included.
        text: the response: ``generated[response_start:]`` without the stop token,
            decoded (special tokens skipped) and stripped; no thinking text.
        stopped_by: ``"eos"``, ``"newline"`` or ``"max_new_tokens"``.
        response_start: index in ``generated`` of the first step after the reasoning
            block (0 without one; ``len(generated)`` when the block never closed).
        thinking: the decoded reasoning block (markers excluded), ``""`` without one.
        continuation_logprobs: with ``score_continuations``, the teacher-forced
            log-probability (nats, summed over tokens) of each continuation right after
            the prompt; else ``None``.
    """

    prompt_len: int
    generated: list[int]
    text: str
    stopped_by: str
    response_start: int = 0
    thinking: str = ""
    continuation_logprobs: list[float] | None = None


@dataclass
class StopState:
    """One trial's stop and thinking state while decoding (:class:`StopRules`).

    Attributes:
        in_think: inside a ``<think>`` block.
        start: the response start in ``generated`` (None while thinking).
        after_think: only whitespace generated since the block closed.
        stopped_by: as in :class:`DecodeResult` (``"max_new_tokens"`` until a stop).
    """

    in_think: bool = False
    start: int | None = 0
    after_think: bool = False
    stopped_by: str = "max_new_tokens"


@dataclass(frozen=True)
class StopRules:
    """The stop and thinking rules of greedy decoding, one object for every decoder
    (:func:`locos_tl.engine.greedy.greedy_loop`), so all decide every token alike.

    Build it with :meth:`of`. Per trial, :meth:`initial` gives the state after the
    prompt; each generated token goes through :meth:`is_thinking` then :meth:`advance`
    (which says whether decoding stops there); :meth:`result` makes the
    :class:`DecodeResult`.

    Attributes:
        tok: the tokenizer (decodes a token to test it against the stop rule).
        stop_ids: end-of-sequence ids that stop (empty with ``stop_at_eos=False``).
        think_open, think_close: ``<think>`` / ``</think>`` ids (empty with
            ``thinking=False``).
        stop_rule: which newline stops (:func:`is_newline_stop`; ``"none"``: none).
    """

    tok: Any
    stop_ids: frozenset[int]
    think_open: frozenset[int]
    think_close: frozenset[int]
    stop_rule: StopRule = "newline_token"

    @classmethod
    def of(cls, model: Any, stop_rule: str = "newline_token", thinking: bool = True, *,
           stop_at_eos: bool = True) -> StopRules:
        """The rules of ``model``'s tokenizer: EOS ids from the tokenizer and the
        generation config, thinking markers found by text
        (:func:`locos_tl.engine.answers.think_token_ids`).

        Raises:
            ValueError: unknown ``stop_rule``.
        """
        rule = check_stop_rule(stop_rule)
        tok = model.tokenizer
        think_open, think_close = think_token_ids(tok) if thinking else (frozenset(), frozenset())
        return cls(tok, frozenset(_stop_ids(model)) if stop_at_eos else frozenset(),
                   think_open, think_close, rule)

    def initial(self, prompt: Tensor | Sequence[int]) -> StopState:
        """The state after the prompt ``[N]`` (does it leave a thinking block open?)."""
        if not (self.think_open or self.think_close):
            return StopState()
        ids = prompt.tolist() if isinstance(prompt, Tensor) else [int(x) for x in prompt]
        in_think, _ = scan_think(ids, self.think_open, self.think_close)
        return StopState(in_think=in_think, start=None if in_think else 0)

    def is_thinking(self, state: StopState, y: int) -> bool:
        """Whether token ``y`` belongs to a thinking block (its markers included)."""
        return state.in_think or y in self.think_open or y in self.think_close

    def advance(self, state: StopState, t: int, y: int, step_thinking: bool) -> bool:
        """Update ``state`` after token ``y`` at step ``t``; True when decoding stops
        here (``state.stopped_by`` says why)."""
        if y in self.stop_ids:
            state.stopped_by = "eos"
            return True
        if y in self.think_open:
            state.in_think, state.start, state.after_think = True, None, False
        elif y in self.think_close:
            state.in_think, state.start, state.after_think = False, t + 1, True
        if step_thinking:
            return False
        text_y = self.tok.decode([y])
        if state.after_think and not text_y.strip():  # "</think>\n\n": part of the block
            return False
        state.after_think = False
        if is_newline_stop(text_y, self.stop_rule):
            state.stopped_by = "newline"
            return True
        return False

    def result(self, state: StopState, prompt_len: int, generated: list[int]) -> DecodeResult:
        """The :class:`DecodeResult` of a finished decode."""
        tok = self.tok
        n_gen = len(generated)
        start = n_gen if state.start is None else state.start
        end = n_gen - 1 if state.stopped_by != "max_new_tokens" else n_gen
        text = (tok.decode(generated[start:end], skip_special_tokens=True).strip()
                if end > start else "")
        think_ids = [g for g in generated[: min(start, end)]
                     if g not in self.think_open and g not in self.think_close]
        thought = tok.decode(think_ids, skip_special_tokens=True).strip() if think_ids else ""
        return DecodeResult(prompt_len=prompt_len, generated=generated, text=text,
                            stopped_by=state.stopped_by, response_start=start,
                            thinking=thought)

def _stop_ids(model: Any) -> set[int]:
    ids: set[int] = set()
    tok = model.tokenizer
    gen_cfg = getattr(hf_model(model), "generation_config", None)
    for src in (getattr(tok, "eos_token_id", None), getattr(gen_cfg, "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, Sequence):
            ids.update(int(i) for i in src)
    return ids


def stop_predicate(model: Any, prompt: Sequence[int], *, stop_rule: str = "newline_token",
                   thinking: bool = True, stop_at_eos: bool = True) -> Callable[[int, int], bool]:
    """``stop(t, y)``: whether :func:`locos_tl.engine.decode.greedy_decode` with these
    rules, on ``prompt``, stops after generating ``y`` at step ``t``. Call it once per
    step, in order (it keeps the thinking state).

    Raises:
        ValueError: unknown ``stop_rule``.
    """
    rules = StopRules.of(model, stop_rule, thinking, stop_at_eos=stop_at_eos)
    state = rules.initial(prompt)

    def stop(t: int, y: int) -> bool:
        return rules.advance(state, t, y, rules.is_thinking(state, y))

    return stop
