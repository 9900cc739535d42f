"""The one greedy loop: every decoder of the package drives it with its own forward.

:func:`locos_tl.engine.decode.greedy_decode` (one prompt, the eager twin, the SDPA twin
or the bridge), the batched scorer (:mod:`locos_tl.runs.batch`: ``B`` prompts on the
eager twin, rows dropped from the batch as they stop) and the compressed decode
(:mod:`locos_tl.experiments.compress`: the question through a compressed KV cache) differ
only in how a step computes its logits and what they record per step. The loop owns
the rest, the same for all: the budget (``max_new_tokens``), the greedy pick (the argmax
of finite logits, one host read per step), the error on NaN or inf logits, teacher
forcing, and the stop and thinking rules (:class:`locos_tl.engine.stops.StopRules`).

A decoder passes a forward (:class:`GreedyForward`): ``forward(t, rows, last)`` runs
decoding step ``t`` for the rows still decoding and returns their logits. Step 0 feeds
each prompt's tail (the decoder knows which: the last token, or a compressed decode's
whole question); step ``t > 0`` feeds ``last``, each row's token of step ``t - 1``. Per
token, ``on_token(row, t, y, thinking)`` lets the decoder record its step (attention
rows, values, phi) before the stop is decided; ``on_done(row, state)`` reports each row
as it finishes, in the order rows stop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import torch
from torch import Tensor

from locos_tl.engine.options import check_max_new_tokens
from locos_tl.engine.stops import DecodeResult, StopRules, StopState
from locos_tl.errors import NonFiniteError

__all__ = ["GreedyForward", "GreedyRow", "check_max_new_tokens", "greedy_loop"]


@runtime_checkable
class GreedyForward(Protocol):
    """One decoding step of a decoder, called by :func:`greedy_loop`."""

    def __call__(self, t: int, rows: list[int], last: list[int] | None) -> Tensor:
        """Run step ``t`` for ``rows`` and return their logits ``[len(rows), d_vocab]``.

        Args:
            t: the 0-based step; step ``t`` chooses generated token ``y_t``.
            rows: indices (into the loop's prompts, ascending) of the rows still
                decoding: the previous call's rows less those that stopped since (a
                batched forward drops the others from its KV cache).
            last: per row of ``rows``, the token it chose at step ``t - 1`` (its next
                input); None at step 0, where each prompt's tail is fed.
        """
        ...


@dataclass
class GreedyRow:
    """One prompt's decoding in :func:`greedy_loop`.

    Attributes:
        prompt_len: the prompt's tokens ``N``.
        state: its stop and thinking state (:class:`locos_tl.engine.stops.StopState`;
            ``stopped_by == "non_finite"`` after NaN or inf logits).
        generated: the generated ids so far, the stop token included.
        non_finite: why decoding gave up on this row (NaN or inf logits, step and dtype
            named), with ``non_finite="drop"``; else None.
        result: the :class:`locos_tl.engine.stops.DecodeResult` once the row is done
            (None while decoding, or when ``non_finite`` is set).
    """

    prompt_len: int
    state: StopState
    generated: list[int] = field(default_factory=list)
    non_finite: str | None = None
    result: DecodeResult | None = None


def greedy_loop(
    forward: GreedyForward,
    prompts: Sequence[Tensor | Sequence[int]],
    rules: StopRules,
    *,
    max_new_tokens: int,
    forced_tokens: Sequence[int] | None = None,
    on_token: Callable[[int, int, int, bool], None] | None = None,
    on_done: Callable[[int, GreedyRow], None] | None = None,
    non_finite: Literal["raise", "drop"] = "raise",
    what: str = "decoding",
) -> list[GreedyRow]:
    """Greedy decoding of ``prompts`` together, each stopping by ``rules``.

    At every step the loop calls ``forward`` once for the rows still decoding, picks each
    row's argmax (one host read for the whole step), checks that the logits are finite,
    replaces the pick by ``forced_tokens[t]`` when teacher forcing, marks thinking
    tokens, calls ``on_token`` and decides the stop (EOS, a newline as the stop rule
    defines it, or the budget).

    Args:
        forward: the decoder's step (:class:`GreedyForward`).
        prompts: each row's prompt ids ``[N_b]`` (for the thinking state and
            ``DecodeResult.prompt_len``; the forward holds the model's inputs).
        rules: the stop and thinking rules (:meth:`StopRules.of`).
        max_new_tokens: at most this many generated tokens per row (``>= 1``).
        forced_tokens: teacher forcing (one prompt only): step ``t`` takes
            ``forced_tokens[t]`` instead of the argmax, decoding ends when they run out;
            the logits must still be finite.
        on_token: ``on_token(row, t, y, thinking)`` for each chosen token, before the
            stop is decided (the stop token included).
        on_done: ``on_done(row, state)`` as each row finishes (stopped, out of budget,
            or dropped for non-finite logits), in that order.
        non_finite: ``"raise"`` (default) a :class:`NonFiniteError` on NaN or inf logits,
            or ``"drop"`` the row (``GreedyRow.non_finite`` says why) and go on with the
            others.
        what: how the error message names the decoding (``"compressed decoding"``).

    Returns:
        One :class:`GreedyRow` per prompt, in order, each with its ``result``.

    Raises:
        ValueError: ``max_new_tokens`` not an integer >= 1; ``forced_tokens`` with more
            than one prompt; an unknown ``non_finite``.
        NonFiniteError: a step's logits hold NaN or inf (``non_finite="raise"``).
    """
    check_max_new_tokens(max_new_tokens)
    if non_finite not in ("raise", "drop"):
        raise ValueError(f"non_finite must be 'raise' or 'drop', got {non_finite!r}")
    if forced_tokens is not None:
        if len(prompts) != 1:
            raise ValueError(f"forced_tokens needs one prompt, got {len(prompts)}")
        max_new_tokens = min(max_new_tokens, len(forced_tokens))
    rows = [GreedyRow(len(p), rules.initial(p)) for p in prompts]

    def done(i: int) -> None:
        row = rows[i]
        if row.non_finite is None:
            row.result = rules.result(row.state, row.prompt_len, row.generated)
        if on_done is not None:
            on_done(i, row)

    active = list(range(len(rows)))
    last: list[int] | None = None
    for t in range(max_new_tokens if active else 0):
        logits = forward(t, active, last)  # [len(active), d_vocab]
        pick = torch.where(torch.isfinite(logits).all(-1), logits.argmax(-1), -1)
        # the step's one host read: each row's token id, -1 when its logits hold NaN/inf
        picks = [int(pick[0])] if len(active) == 1 else pick.tolist()
        keep: list[int] = []
        for i, y in zip(active, picks, strict=True):
            row = rows[i]
            if y < 0:  # e.g. fp16 overflow: argmax would be 0
                msg = (f"{what} step {t}: the logits hold NaN or inf (dtype {logits.dtype}; "
                       "an fp16 overflow? try bfloat16)")
                if non_finite == "raise":
                    raise NonFiniteError(msg)
                row.non_finite, row.state.stopped_by = msg, "non_finite"
                done(i)
                continue
            if forced_tokens is not None:
                y = int(forced_tokens[t])
            thinking = rules.is_thinking(row.state, y)
            if on_token is not None:
                on_token(i, t, y, thinking)
            row.generated.append(y)
            if rules.advance(row.state, t, y, thinking):
                done(i)
                continue
            keep.append(i)
        active = keep
        if not active:
            break
        last = [rows[i].generated[-1] for i in active]
    for i in active:
        done(i)
    return rows
