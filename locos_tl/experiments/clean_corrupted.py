"""The clean and corrupted runs of a trial, as CRI and AtP both take them.

CRI (:mod:`locos_tl.experiments.patching`) and AtP (:mod:`locos_tl.experiments.atp`)
compare a trial's *clean* prompt with a *corrupted* one (the needle replaced:
:func:`~locos_tl.experiments.corruption.corrupt_tokens`) at the position before the
first answer token, through the metric

    m = logit[gold] - logit[c],   c = argmax of the corrupted run's logits, gold excluded

(:func:`logit_diff`, logits). This module holds what the two share:
:func:`clean_corrupted_pair` (the two token sequences, the gold candidates and their
shared prefix), :func:`clean_run` (the prefix's KV cache, the clean run's ``hook_z`` and
the gold token) and the forward helpers :func:`last_logits` and :func:`copy_cache`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from jaxtyping import Float, Int
from torch import Tensor

from locos_tl.engine.answers import answer_steps, answer_token_variants
from locos_tl.engine.decode import DecodeStep, greedy_decode
from locos_tl.engine.forward import _new_cache
from locos_tl.engine.interventions import intervene
from locos_tl.engine.twin import sdpa_twin
from locos_tl.experiments.corruption import AnswerPosition, Corruption, corrupt_tokens
from locos_tl.trials import Trial

__all__ = ["CleanRun", "answer_target", "clean_corrupted_pair", "clean_run", "copy_cache",
           "last_logits", "logit_diff"]


@torch.no_grad()
def last_logits(
    model: Any,
    ids: Int[Tensor, "batch pos"],
    *,
    chunk_size: int,
    start: int = 0,
    cache: Any = None,
    fwd_hooks: Sequence[tuple[str, Callable]] = (),
    state: dict[str, int] | None = None,
) -> Float[Tensor, "batch d_vocab"]:
    """Run ``ids[:, start:]`` in query chunks on top of ``cache`` (which must hold
    positions ``[0, start)``; a fresh cache by default) and return the last position's
    logits (float32).

    ``fwd_hooks`` are registered interventions
    (:func:`locos_tl.engine.interventions.intervene`): the forwards run on the SDPA twin
    with the same hooks as module hooks when it reproduces everything attached, else
    through the bridge. ``state["start"]`` holds each chunk's first absolute position,
    for position-aware hooks.

    Raises:
        ValueError: nothing to run (``start`` at or past the last position).
    """
    cache = _new_cache(model) if cache is None else cache
    logits = None
    with intervene(model, list(fwd_hooks)) as engine:  # the twin runs the same hooks
        twin = sdpa_twin(model) if engine == "twin" else None
        for i in range(start, ids.shape[1], chunk_size):
            if state is not None:
                state["start"] = i
            chunk = ids[:, i : i + chunk_size]
            if twin is not None:
                logits = twin(chunk, past_key_values=cache, use_cache=True,
                              logits_to_keep=1).logits
            else:
                logits = model(chunk, past_key_values=cache, use_cache=True, logits_to_keep=1)
    if logits is None:
        raise ValueError(f"nothing to run: start={start} >= {ids.shape[1]} positions")
    return logits[:, -1].float()


def copy_cache(cache: Any, batch: int = 1) -> Any:
    """An independent copy of a KV cache, repeated ``batch`` times along the batch axis."""
    out = copy.deepcopy(cache)
    if batch > 1:
        out.batch_repeat_interleave(batch)
    return out


def logit_diff(logits: Tensor, gold: int, cf: int) -> Tensor:
    """The patching metric ``logits[..., gold] - logits[..., cf]`` (logits)."""
    return logits[..., gold] - logits[..., cf]


class _AnswerFound(Exception):
    """Raised from a decode callback to stop once the answer's first token is known."""


def answer_target(
    model: Any, trial: Trial, answer_position: AnswerPosition, max_new_tokens: int
) -> tuple[list[int], set[int]] | None:
    """``(prefix, gold candidates)``: the tokens between the prompt and the first answer
    token, and that token (``"generated"``: the clean run's greedy response, at most
    ``max_new_tokens``; None when it never contains the answer) or the first tokens of
    the answer's tokenizations (``"prompt_end"``; the one the clean run prefers is
    used)."""
    if answer_position == "prompt_end":
        return [], {v[0] for v in answer_token_variants(model.tokenizer, trial.answer)}
    generated: list[int] = []
    longest = max(len(v) for v in answer_token_variants(model.tokenizer, trial.answer))

    def stop_when_found(step: DecodeStep) -> None:
        generated.append(step.token)
        found = answer_steps(model.tokenizer, generated, trial.answer)
        if found and len(generated) >= found[0] + longest:  # no earlier match can appear
            raise _AnswerFound

    try:
        res = greedy_decode(model, trial.tokens, max_new_tokens=max_new_tokens,
                            on_step=stop_when_found)
        generated = res.generated
    except _AnswerFound:
        pass
    steps = answer_steps(model.tokenizer, generated, trial.answer)
    if not steps:
        return None
    return generated[: steps[0]], {generated[steps[0]]}


@torch.no_grad()
def clean_corrupted_pair(
    model: Any, trial: Trial, corruption: Corruption, *, answer_position: AnswerPosition,
    max_new_tokens: int, filler: str | Sequence[int], swap_names: Sequence[str],
) -> tuple[dict[str, Any], tuple[list[int], Any, Tensor, Tensor, int] | None]:
    """A trial's clean and corrupted runs, as CRI and AtP take them: ``(record, pair)``,
    the record skeleton and ``(prefix, golds, clean, corrupted, shared)`` (answer prefix,
    gold ids, two ``[1, P]`` token tensors, length of their shared prefix, at most
    ``P - 1``); ``pair`` is None when no answer was found (``dropped: no_answer_step``).

    Raises:
        ValueError, TrialError: see :func:`~locos_tl.experiments.corruption.corrupt_tokens`.
    """
    device = next(model.original_model.parameters()).device
    record: dict[str, Any] = {"trial_id": trial.trial_id, "accepted": False, "dropped": None,
                              "scores": {}, "meta": trial.meta}
    corrupted = corrupt_tokens(model.tokenizer, trial, corruption, filler=filler,
                               swap_names=swap_names)
    target = answer_target(model, trial, answer_position, max_new_tokens)
    if target is None:
        record["dropped"] = "no_answer_step"
        return record, None
    prefix, golds = target
    clean = torch.tensor([list(trial.tokens) + prefix], device=device)
    corr = torch.tensor([corrupted + prefix], device=device)
    diff = (clean != corr)[0].nonzero()
    shared = min(int(diff[0]) if diff.numel() else clean.shape[1], clean.shape[1] - 1)
    return record, (prefix, golds, clean, corr, shared)


class CleanRun(NamedTuple):
    """The clean run of a pair (:func:`clean_run`)."""

    #: KV cache of positions ``[0, shared)`` (the same in the clean and corrupted runs);
    #: run on a :func:`copy_cache` of it
    prefix_cache: Any
    #: layer -> the clean run's ``hook_z`` over positions ``[shared, P)``, as
    #: ``[pos, n_heads, d_head]`` chunks (one a query chunk)
    z: dict[int, list[Tensor]]
    #: ``[d_vocab]`` float32 logits at the last position
    logits: Tensor
    #: the gold token: the candidate the clean run prefers (the highest logit)
    gold: int


def clean_run(model: Any, clean: Int[Tensor, "1 pos"], golds: set[int], *, shared: int,
              chunk_size: int) -> CleanRun:
    """Run the shared prefix ``clean[:, :shared]`` once into a KV cache, then the rest of
    the clean prompt on a copy of it keeping every layer's ``hook_z``; the gold token is
    the candidate of ``golds`` with the highest clean logit (ties: the smallest id)."""
    prefix_cache = _new_cache(model)
    if shared > 0:  # identical in both runs (causal attention): computed once
        last_logits(model, clean[:, :shared], chunk_size=chunk_size, cache=prefix_cache)
    z: dict[int, list[Tensor]] = {}

    def keep_z(x: Tensor, hook: Any) -> None:  # positions [shared, P) of the clean run
        z.setdefault(int(hook.name.split(".")[1]), []).append(x[0].detach())

    logits = last_logits(
        model, clean, chunk_size=chunk_size, start=shared, cache=copy_cache(prefix_cache),
        fwd_hooks=[(f"blocks.{l}.attn.hook_z", keep_z)
                   for l in range(int(model.cfg.n_layers))])[0]
    gold = max(sorted(golds), key=lambda t: float(logits[t]))
    return CleanRun(prefix_cache, z, logits, gold)
