"""The local executor: runs trials one after another in this process.

It only schedules: each trial goes through the one trial runner
(:func:`locos_tl.runs.runner.run_trial`); the run's bookkeeping (settings, resume,
acceptance, aggregation) is the runner's :class:`~locos_tl.runs.runner.ScoringRun`, which
:func:`locos_tl.experiments.score.score_trials` builds around it. The Ray executor
(:mod:`locos_tl.runs.distributed`) is its sibling; neither imports the other.

:func:`run_chunk` is the seam for batched decoding: it receives a chunk of trials and
returns their records in order, so a batched engine (``locos_tl.runs.batch``) can decode a
whole chunk together without changing anything above it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tqdm.auto import tqdm

from locos_tl.engine.answers import GATE_THRESHOLD
from locos_tl.engine.options import DecodeOptions
from locos_tl.engine.unembed import AnswerDirections
from locos_tl.runs import runner


def run_chunk(
    model: Any,
    trials: Sequence[Any],
    detectors: Sequence[Any],
    *,
    directions: AnswerDirections | None,
    decode: DecodeOptions,
    gate_threshold: float = GATE_THRESHOLD,
    on_record: Callable[[int, dict[str, Any]], None] | None = None,
    batch_size: int = 1,
    run_trial: Callable[..., dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Records of ``trials`` (in order), each made by :func:`locos_tl.runs.runner.run_trial`,
    or, with ``batch_size > 1``, decoded ``batch_size`` at a time by
    :func:`locos_tl.runs.batch.run_trials_batched` (the same records).

    Args:
        model: a TransformerBridge.
        trials: the chunk's trials.
        detectors: the detectors sharing the decode pass.
        directions: the answer directions of phi-based detectors (None: none needs them).
        decode: how each trial is decoded (:class:`~locos_tl.engine.options.DecodeOptions`).
        gate_threshold: the ROUGE-1 recall a response must exceed.
        on_record: called with ``(index in trials, record)`` as each record is made.
        batch_size: trials decoded together (1: one at a time).
        run_trial: the single-trial runner (default :func:`locos_tl.runs.runner.run_trial`;
            :func:`locos_tl.experiments.score.score_trials` passes its own name, so patching
            ``locos_tl.experiments.score.run_trial`` reaches the executor).
    """
    if batch_size > 1:
        from locos_tl.runs.batch import run_trials_batched

        return run_trials_batched(model, trials, detectors, directions=directions,
                                  decode=decode, gate_threshold=gate_threshold,
                                  batch_size=batch_size, on_record=on_record)
    one = run_trial if run_trial is not None else runner.run_trial
    out = []
    for i, trial in enumerate(trials):
        rec = one(model, trial, detectors, directions=directions, decode=decode,
                  gate_threshold=gate_threshold)
        if on_record is not None:
            on_record(i, rec)
        out.append(rec)
    return out


def run_trials_local(
    model: Any,
    trials: Sequence[Any],
    detectors: Sequence[Any],
    *,
    directions: AnswerDirections | None,
    decode: DecodeOptions,
    gate_threshold: float = GATE_THRESHOLD,
    on_record: Callable[[int, dict[str, Any]], None] | None = None,
    progress: bool = True,
    chunk: int = 1,
    batch_size: int = 1,
    run_trial: Callable[..., dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Run ``trials`` here, ``chunk`` at a time through :func:`run_chunk`.

    Args:
        model: a TransformerBridge.
        trials: trials still to run (finished ones are skipped by the caller).
        detectors: the detectors sharing the decode pass.
        directions, decode, gate_threshold, run_trial: as in :func:`run_chunk`.
        on_record: called with ``(index in trials, record)`` as each record is made
            (append it to the run directory there).
        progress: a tqdm bar over trials, with the count of trials accepted so far (the
            answer-step rule: gate passed and an answer step found).
        chunk: trials handed to :func:`run_chunk` at once (``>= 1``); with
            ``batch_size > 1`` at least ``batch_size`` (a chunk's trials are grouped by
            prompt length into batches).
        batch_size: trials decoded together (:func:`run_chunk`).

    Returns:
        One record per trial, in order.
    """
    trials = list(trials)
    if batch_size > 1:
        chunk = max(chunk, batch_size)
    out: list[dict[str, Any]] = []
    bar = tqdm(total=len(trials), desc="scoring trials", unit="trial", disable=not progress)
    accepted = 0
    try:
        for start in range(0, len(trials), max(1, chunk)):
            part = trials[start : start + max(1, chunk)]

            def rec_cb(i: int, rec: dict[str, Any], start: int = start) -> None:
                nonlocal accepted
                accepted += bool(rec.get("accepted"))
                # the answer-step rule's count (LOCOS); each method's own is in its meta
                bar.set_postfix(accepted=f"{accepted}/{bar.n + 1}", refresh=False)
                bar.update(1)
                if on_record is not None:
                    on_record(start + i, rec)

            out += run_chunk(model, part, detectors, directions=directions, decode=decode,
                             gate_threshold=gate_threshold, on_record=rec_cb,
                             batch_size=batch_size, run_trial=run_trial)
    finally:
        bar.close()
    return out
