"""Scoring heads over trials: one greedy decode per trial feeds every detector.

Pipeline per trial (docs/concepts.md): free greedy decoding (at most
``max_new_tokens``, stop at newline / EOS) -> ROUGE-1 recall gate (> 0.5) -> answer
steps -> per-step head values of every detector -> one JSON record. Head scores are
aggregated from records (:meth:`HeadScores.from_records`), so resumed runs and runs
merged from several workers aggregate identically.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from locos_tl.answers import GATE_THRESHOLD, answer_steps, rouge1_recall
from locos_tl.decode import DecodeStep, greedy_decode
from locos_tl.detectors import Detector, get_detector
from locos_tl.errors import TrialError
from locos_tl.heads import HeadScores
from locos_tl.models import model_name
from locos_tl.provenance import provenance
from locos_tl.records import RecordStore
from locos_tl.trials import Trial, trial_set_hash
from locos_tl.unembed import AnswerDirections, check_variant

RESUME_KEYS = ("model", "dtype", "variant", "max_new_tokens", "gate_threshold")


def model_dtype(model: Any) -> str:
    """``"float32"``, ``"bfloat16"``, ... of the model's parameters."""
    return str(next(model.parameters()).dtype).replace("torch.", "")


def run_settings(
    model: str, dtype: str, *, variant: str, methods: Sequence[str], max_new_tokens: int,
    gate_threshold: float, seed: int, trials: Sequence[Trial],
) -> dict[str, Any]:
    """The settings recorded in ``meta.json``; :data:`RESUME_KEYS` of them must match for
    a run directory to be resumed (single-process and distributed runs alike)."""
    return {
        "model": model,
        "dtype": dtype,
        "variant": variant,
        "methods": list(methods),
        "max_new_tokens": max_new_tokens,
        "gate_threshold": gate_threshold,
        "seed": seed,
        "n_trials": len(trials),
        "trial_set_hash": trial_set_hash(trials),
    }


def finished_record(
    store: RecordStore | None, trial: Trial, methods: Sequence[str]
) -> dict[str, Any] | None:
    """The stored record of ``trial`` when it can be reused, else None (not run yet, or
    accepted under fewer methods than ``methods``: then it reruns for the new ones)."""
    rec = store.get(trial.trial_id) if store is not None else None
    if rec is not None and rec["accepted"] and any(m not in rec["scores"] for m in methods):
        return None
    return rec


def check_trials_fit(model: Any, trials: Sequence[Trial], max_new_tokens: int) -> None:
    """Fail before any work when a trial cannot run on ``model``.

    Raises:
        TrialError: a prompt (+ ``max_new_tokens``) exceeds ``n_ctx``, a token id is
            outside the vocabulary, or a needle span lies outside its prompt.
    """
    n_ctx = getattr(model.cfg, "n_ctx", None)
    d_vocab = int(model.cfg.d_vocab)
    for i, t in enumerate(trials):
        if n_ctx and t.n_tokens + max_new_tokens - 1 > n_ctx:
            raise TrialError(
                f"trial {i} ({t.trial_id}): prompt of {t.n_tokens} tokens + {max_new_tokens} "
                f"new tokens is longer than the model's context n_ctx={n_ctx}"
            )
        if max(t.tokens) >= d_vocab or min(t.tokens) < 0:
            raise TrialError(
                f"trial {i} ({t.trial_id}): token id {max(t.tokens)} outside the model's "
                f"vocabulary of {d_vocab} (trials built with another tokenizer?)"
            )


def run_trial(
    model: Any,
    trial: Trial,
    detectors: Sequence[Detector],
    *,
    directions: AnswerDirections | None,
    max_new_tokens: int = 50,
    gate_threshold: float = GATE_THRESHOLD,
    prefill_mode: str = "auto",
    chunk_size: int | None = None,
) -> dict[str, Any]:
    """Decode one trial and return its record (JSON-serialisable).

    Record fields: ``trial_id``, ``response``, ``generated``, ``rouge1_recall``,
    ``accepted`` (gate passed and an answer step found), ``dropped`` (``None``,
    ``"gate"`` or ``"no_answer_step"``), ``answer_steps``, ``scores`` (method ->
    ``[n_layers][n_heads]`` per-trial score), ``step_values`` (method -> values of the
    used steps, answer-step methods only), ``meta``.
    """
    per_step: dict[str, list[torch.Tensor]] = {d.name: [] for d in detectors}

    def on_step(step: DecodeStep) -> None:
        for d in detectors:
            per_step[d.name].append(d.step_value(step, trial.needle_span).cpu())

    result = greedy_decode(
        model, trial.tokens, max_new_tokens=max_new_tokens, on_step=on_step,
        directions=directions, prefill_mode=prefill_mode, chunk_size=chunk_size,
    )
    recall = rouge1_recall(result.text, trial.answer)
    steps = answer_steps(model.tokenizer, result.generated, trial.answer)
    dropped = None
    if recall <= gate_threshold:
        dropped = "gate"
    elif not steps:
        dropped = "no_answer_step"
    record: dict[str, Any] = {
        "trial_id": trial.trial_id,
        "n_prompt_tokens": trial.n_tokens,
        "needle_span": list(trial.needle_span),
        "answer": trial.answer,
        "response": result.text,
        "generated": result.generated,
        "stopped_by": result.stopped_by,
        "rouge1_recall": recall,
        "accepted": dropped is None,
        "dropped": dropped,
        "answer_steps": steps,
        "scores": {},
        "step_values": {},
        "meta": trial.meta,
    }
    if dropped is None:
        for d in detectors:
            vals = torch.stack(per_step[d.name])
            score = d.trial_score(vals, steps)
            record["scores"][d.name] = None if score is None else score.tolist()
            if d.steps == "answer":
                record["step_values"][d.name] = vals[steps].tolist()
    return record


def score_trials(
    model: Any,
    trials: Sequence[Trial],
    *,
    method: str = "locos",
    methods: Sequence[str] | None = None,
    variant: str = "raw",
    max_new_tokens: int = 50,
    out_dir: str | Path | None = None,
    seed: int = 0,
    gate_threshold: float = GATE_THRESHOLD,
    progress: bool = True,
    prefill_mode: str = "auto",
    chunk_size: int | None = None,
    workers: int = 1,
    ray_address: str | None = None,
    **distributed_kwargs: Any,
) -> HeadScores | dict[str, HeadScores]:
    """Score every attention head over retrieval trials.

    LOCOS (Gema, Alex & Minervini 2026, arXiv 2607.01002, Eq. 2-3) by default; the
    baselines ``wu``, ``headkv``, ``attention_spatial`` and ``dla`` (docs/concepts.md)
    share the same decode pass when several are asked with ``methods=[...]``.

    Args:
        model: a TransformerBridge (see :func:`locos_tl.load_model`).
        trials: the trials; prompts plus ``max_new_tokens`` must fit in ``n_ctx``.
        method: one method name (ignored when ``methods`` is given).
        methods: method names sharing one decode pass; then a ``{method: HeadScores}``
            dict is returned (also for a single name).
        variant: ``"raw"`` (paper) or ``"exact"`` (norm scales frozen; phi sums to DLA).
        max_new_tokens: greedy decoding budget per trial.
        out_dir: run directory; one JSON line per finished trial is appended to
            ``trials.jsonl`` and ``meta.json`` holds provenance; rerunning with the same
            settings skips finished trials.
        seed: bootstrap seed (decoding is greedy, hence deterministic).
        gate_threshold: ROUGE-1 recall a response must exceed to count.
        progress: show a tqdm bar over trials.
        prefill_mode, chunk_size: see :func:`locos_tl.decode.prefill`.
        workers: > 1 (or a ``ray_address``): run on that many Ray actors, each loading
            the model from its name/path (``model`` may then be that name/path, or a
            bridge whose recorded path and dtype are reused); identical scores; needs
            ``pip install "locos_tl[ray]"``. See :mod:`locos_tl.distributed`.
        ray_address: a running Ray cluster; None starts a local one for the run.
        **distributed_kwargs: more options of
            :func:`locos_tl.distributed.score_trials_distributed` (``load_kwargs``,
            ``num_gpus_per_worker``, ...).

    Returns:
        :class:`HeadScores` (``[n_layers, n_heads]`` scores, CI, per-trial scores), or a
        dict of them keyed by method.

    Raises:
        ValueError: unknown method or variant.
        TrialError: a trial does not fit the model (checked before any decoding).
        LocosError: ``out_dir`` holds a run made with other settings.
        DistributedError: ``workers`` > 1 without Ray installed (says how to install it).
    """
    if workers > 1 or ray_address is not None or distributed_kwargs:
        from locos_tl.distributed import score_trials_distributed

        return score_trials_distributed(  # the workers load `model` (name, path or bridge's)
            model, trials, workers=workers, ray_address=ray_address,
            method=method, methods=methods, variant=variant, max_new_tokens=max_new_tokens,
            out_dir=out_dir, seed=seed, gate_threshold=gate_threshold, progress=progress,
            prefill_mode=prefill_mode, chunk_size=chunk_size, **distributed_kwargs,
        )
    names = list(methods) if methods is not None else [method]
    if not names:
        raise ValueError("no method given")
    detectors = [get_detector(m) for m in names]
    variant = check_variant(variant)
    trials = list(trials)
    if not trials:
        raise ValueError("no trials to score")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    check_trials_fit(model, trials, max_new_tokens)
    directions = AnswerDirections(model, variant) if any(d.needs_phi for d in detectors) else None
    settings = run_settings(model_name(model), model_dtype(model), variant=variant,
                            methods=names, max_new_tokens=max_new_tokens,
                            gate_threshold=gate_threshold, seed=seed, trials=trials)
    store = RecordStore(out_dir, settings, RESUME_KEYS) if out_dir is not None else None
    meta = provenance(model, settings)
    if store is not None:
        store.write_meta(meta)
    records: list[dict[str, Any]] = []
    for trial in tqdm(trials, desc="scoring trials", unit="trial", disable=not progress):
        rec = finished_record(store, trial, names)
        if rec is None:
            rec = run_trial(model, trial, detectors, directions=directions,
                            max_new_tokens=max_new_tokens, gate_threshold=gate_threshold,
                            prefill_mode=prefill_mode, chunk_size=chunk_size)
            if store is not None:
                store.append(rec)
        records.append(rec)
    return aggregate(records, names, model=model, variant=variant, meta=meta, seed=seed,
                     as_dict=methods is not None)


def aggregate(
    records: Sequence[dict[str, Any]],
    methods: Sequence[str],
    *,
    model: Any,
    variant: str,
    meta: dict[str, Any],
    seed: int = 0,
    as_dict: bool | None = None,
) -> HeadScores | dict[str, HeadScores]:
    """Build :class:`HeadScores` from per-trial records (order-independent).

    Returns a ``{method: HeadScores}`` dict when ``as_dict`` (default: when there are
    several methods), else the one method's :class:`HeadScores`.
    """
    counts = {
        "n_trials": len(records),
        "n_accepted": sum(bool(r["accepted"]) for r in records),
        "n_dropped_gate": sum(r["dropped"] == "gate" for r in records),
        "n_dropped_no_answer_step": sum(r["dropped"] == "no_answer_step" for r in records),
    }
    L, H = int(model.cfg.n_layers), int(model.cfg.n_heads)
    out = {
        m: HeadScores.from_records(records, m, n_layers=L, n_heads=H, variant=variant,
                                   meta={**meta, **counts}, seed=seed)
        for m in methods
    }
    if as_dict is None:
        as_dict = len(methods) > 1
    return out if as_dict else out[methods[0]]
