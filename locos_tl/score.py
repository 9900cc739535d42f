"""Scoring heads over trials: one greedy decode per trial feeds every detector.

Pipeline per trial (docs/concepts.md): free greedy decoding (at most
``max_new_tokens``, stop at the bare newline token / EOS, a ``<think>`` block
skipped) -> ROUGE-1 recall gate (> 0.5) -> answer steps -> per-step head values of
every detector -> one JSON record. Head scores are aggregated from records
(:meth:`HeadScores.from_records`), so resumed runs and runs merged from several
workers aggregate identically.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from locos_tl.acceptance import acceptance_counts
from locos_tl.answers import GATE_THRESHOLD, answer_steps, rouge1_recall
from locos_tl.decode import DecodeStep, StopRule, check_stop_rule, greedy_decode
from locos_tl.detectors import SPAN_NAMES, Detector, TrialOutcome, get_detector
from locos_tl.errors import NonFiniteError, TrialError
from locos_tl.head_spec import as_int
from locos_tl.heads import HeadScores
from locos_tl.models import model_name
from locos_tl.provenance import provenance
from locos_tl.records import RecordStore
from locos_tl.rundir import prune_stale_methods
from locos_tl.trials import Trial, trial_set_hash
from locos_tl.unembed import AnswerDirections, check_variant

RESUME_KEYS = ("model", "dtype", "variant", "max_new_tokens", "gate_threshold", "stop_rule",
               "thinking")


def model_dtype(model: Any) -> str:
    """``"float32"``, ``"bfloat16"``, ... of the model's parameters."""
    return str(next(model.parameters()).dtype).replace("torch.", "")


def run_settings(
    model: str, dtype: str, *, variant: str, methods: Sequence[str], max_new_tokens: int,
    gate_threshold: float, seed: int, trials: Sequence[Trial],
    stop_rule: str = "newline_token", thinking: bool = True,
    spans: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The settings recorded in ``meta.json``; :data:`RESUME_KEYS` of them must match for
    a run directory to be resumed (single-process and distributed runs alike).
    ``spans`` (method -> span name) is recorded, not a resume key: a record made with
    another span for a method reruns (:func:`finished_record`)."""
    return {
        "model": model,
        "dtype": dtype,
        "variant": variant,
        "methods": list(methods),
        "max_new_tokens": max_new_tokens,
        "gate_threshold": gate_threshold,
        "stop_rule": stop_rule,
        "thinking": thinking,
        "spans": dict(spans or {}),
        "seed": seed,
        "n_trials": len(trials),
        "trial_set_hash": trial_set_hash(trials),
    }


def finished_record(
    store: RecordStore | None, trial: Trial, methods: Sequence[str],
    spans: dict[str, str] | None = None,
) -> dict[str, Any] | None:
    """The stored record of ``trial`` when it can be reused, else None: not run yet, run
    without a decision for some of ``methods`` (then it reruns for the new ones; records
    written before per-method acceptance always rerun), or run with another span for
    a method than ``spans`` (method -> span name) asks."""
    rec = store.get(trial.trial_id) if store is not None else None
    if rec is None:
        return None
    decided = rec.get("dropped_by") or {}
    if any(m not in decided for m in methods):
        return None
    if spans and any((rec.get("spans") or {}).get(m) != sp for m, sp in spans.items()):
        return None
    return rec


def method_spans(detectors: Sequence[Detector]) -> dict[str, str]:
    """Method -> the span name its detector reads (recorded in settings and meta)."""
    return {d.name: d.span for d in detectors}


def check_spans(spans: dict[str, str] | None, methods: Sequence[str]) -> dict[str, str]:
    """Validate per-method span overrides (``{"locos": "answer"}``).

    Raises:
        ValueError: a method that is not being scored, or a span other than
            ``"needle"``/``"answer"``.
    """
    spans = dict(spans or {})
    for m, sp in spans.items():
        if m not in methods:
            raise ValueError(f"spans names method {m!r}, which is not scored ({list(methods)})")
        if sp not in SPAN_NAMES:
            raise ValueError(f"span {sp!r} for {m!r}: use 'needle' or 'answer'")
    return spans


def check_trials_fit(model: Any, trials: Sequence[Trial], max_new_tokens: int) -> None:
    """Fail before any work when a trial cannot run on ``model``.

    Raises:
        TrialError: a prompt (+ ``max_new_tokens``) exceeds ``n_ctx``, a token id is
            outside the vocabulary, or a needle span lies outside its prompt.
    """
    n_ctx = getattr(model.cfg, "n_ctx", None)
    d_vocab = int(model.cfg.d_vocab)
    for i, t in enumerate(trials):
        if not isinstance(t, Trial):
            raise TrialError(f"trials[{i}] is a {type(t).__name__}, not a Trial (build "
                             "trials with locos_tl.build_*_trials, Trial(...) or load_trials)")
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


def non_finite_record(trial: Trial, reason: str) -> dict[str, Any]:
    """The record of a trial whose forward pass produced NaN or inf (logits, or phi of a
    phi-based detector): dropped with reason ``"non_finite"``, and a ``RuntimeWarning``."""
    warnings.warn(f"trial {trial.trial_id} dropped (non_finite): {reason}", RuntimeWarning,
                  stacklevel=3)
    return {
        "trial_id": trial.trial_id, "n_prompt_tokens": trial.n_tokens,
        "needle_span": list(trial.needle_span), "answer": trial.answer, "response": "",
        "generated": [], "stopped_by": "non_finite", "rouge1_recall": 0.0,
        "accepted": False, "dropped": "non_finite", "non_finite": reason,
        "answer_steps": [], "scores": {}, "step_values": {}, "meta": trial.meta,
    }


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
    stop_rule: StopRule = "newline_token",
    thinking: bool = True,
) -> dict[str, Any]:
    """Decode one trial and return its record (JSON-serialisable).

    ``stop_rule`` and ``thinking`` as in :func:`locos_tl.decode.greedy_decode`; answer
    steps are searched only after a thinking block (``response_start``).

    Record fields: ``trial_id``, ``response``, ``generated``, ``rouge1_recall``,
    ``accepted`` (gate passed and an answer step found), ``dropped`` (``None``,
    ``"gate"``, ``"no_answer_step"`` or ``"non_finite"``: NaN/inf logits or phi, with a
    ``RuntimeWarning`` and the reason in ``non_finite``), ``answer_steps``, ``scores`` (method ->
    ``[n_layers][n_heads]`` per-trial score), ``step_values`` (method -> values of the
    used steps, answer-step methods only), ``meta``. ``accepted``/``dropped`` are the
    answer-step rule (LOCOS); each method accepts by its own published rule
    (``Detector.drop_reason``): ``dropped_by`` maps method -> ``None`` (counted) or the
    reason, and only counted methods get a score. ``spans`` maps method -> the span
    name it read (``"needle"``/``"answer"``, :meth:`Trial.span`); ``needle_span`` and
    ``answer_span`` are the trial's spans.
    """
    per_step: dict[str, list[torch.Tensor]] = {d.name: [] for d in detectors}
    needs_phi = any(d.needs_phi for d in detectors)
    phi_ok: list[torch.Tensor] = []  # per-step finiteness of phi, read once at the end
    spans = {d.name: trial.span(d.span) for d in detectors}  # each method's own span
    window = max((d.prompt_window for d in detectors), default=0)
    prompt_vals: dict[str, dict[int, torch.Tensor]] = {
        d.name: {} for d in detectors if d.prompt_window}

    def on_step(step: DecodeStep) -> None:
        if needs_phi:
            phi_ok.append(torch.isfinite(step.phi).all())
        for d in detectors:
            if d.steps == "prompt" and step.t > 0:  # prompt-only: step 0 is position N-1
                continue
            per_step[d.name].append(d.step_value(step, spans[d.name]).cpu())

    def on_prompt_rows(layer: int, rows: torch.Tensor) -> None:
        for d in detectors:
            if d.prompt_window:
                prompt_vals[d.name][layer] = d.prompt_value(rows, spans[d.name]).cpu()

    try:
        result = greedy_decode(
            model, trial.tokens, max_new_tokens=max_new_tokens, on_step=on_step,
            directions=directions, prefill_mode=prefill_mode, chunk_size=chunk_size,
            stop_rule=stop_rule, thinking=thinking, prompt_window=window,
            on_prompt_rows=on_prompt_rows if window else None,
        )
        if phi_ok and not bool(torch.stack(phi_ok).all()):
            bad = int((~torch.stack(phi_ok)).nonzero()[0])
            raise NonFiniteError(f"decoding step {bad}: phi holds NaN or inf")
    except NonFiniteError as exc:
        rec = non_finite_record(trial, str(exc))
        rec["dropped_by"] = {d.name: "non_finite" for d in detectors}
        rec["spans"] = {d.name: d.span for d in detectors}
        return rec
    recall = rouge1_recall(result.text, trial.answer)
    steps = answer_steps(model.tokenizer, result.generated, trial.answer,
                         start=result.response_start)
    dropped = None
    if recall <= gate_threshold:
        dropped = "gate"
    elif not steps:
        dropped = "no_answer_step"
    outcome = TrialOutcome(
        generated=list(result.generated), response=result.text, answer=trial.answer,
        rouge1_recall=recall, answer_steps=list(steps), gate_threshold=gate_threshold,
        tokenizer=model.tokenizer, response_start=result.response_start,
    )
    dropped_by = {d.name: d.drop_reason(outcome) for d in detectors}
    record: dict[str, Any] = {
        "trial_id": trial.trial_id,
        "n_prompt_tokens": trial.n_tokens,
        "needle_span": list(trial.needle_span),
        "answer_span": None if trial.answer_span is None else list(trial.answer_span),
        "spans": {d.name: d.span for d in detectors},
        "answer": trial.answer,
        "response": result.text,
        "generated": result.generated,
        "stopped_by": result.stopped_by,
        "response_start": result.response_start,
        "rouge1_recall": recall,
        "accepted": dropped is None,
        "dropped": dropped,
        "dropped_by": dropped_by,
        "answer_steps": steps,
        "scores": {},
        "step_values": {},
        "meta": trial.meta,
    }
    L = int(model.cfg.n_layers)
    for d in detectors:
        if dropped_by[d.name] is not None:
            continue
        used = d.used_steps(outcome)
        vals = torch.stack(per_step[d.name])[torch.as_tensor(used, dtype=torch.long)]
        pv = prompt_vals.get(d.name)
        pv_t = torch.stack([pv[layer] for layer in range(L)]) if pv else None
        score = d.trial_score(vals, prompt_values=pv_t)
        record["scores"][d.name] = None if score is None else score.tolist()
        if d.steps == "answer":
            record["step_values"][d.name] = vals.tolist()
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
    stop_rule: StopRule = "newline_token",
    thinking: bool = True,
    spans: dict[str, str] | None = None,
    workers: int = 1,
    ray_address: str | None = None,
    **distributed_kwargs: Any,
) -> HeadScores | dict[str, HeadScores]:
    """Score every attention head over retrieval trials.

    LOCOS (Gema, Alex & Minervini 2026, arXiv 2607.01002, Eq. 2-3) by default; the
    baselines ``wu``, ``headkv``, ``headkv_anchor``, ``attention_spatial`` and ``dla``
    (docs/concepts.md, protocol table) share the same decode pass when several are
    asked with ``methods=[...]``. Each method reads its published span and accepts
    trials by its published rule; ``HeadScores.meta`` holds that method's ``span``,
    ``n_accepted`` and drop counts, and ``acceptance`` (every method's counts, also
    written to ``meta.json``).

    Args:
        model: a TransformerBridge (see :func:`locos_tl.load_model`).
        trials: the trials; prompts plus ``max_new_tokens`` must fit in ``n_ctx``.
        method: one method name (ignored when ``methods`` is given).
        methods: method names sharing one decode pass (one name as a string is one
            method); then a ``{method: HeadScores}``
            dict is returned (also for a single name).
        variant: ``"raw"`` (paper) or ``"exact"`` (norm scales frozen; phi sums to DLA).
        max_new_tokens: greedy decoding budget per trial.
        out_dir: run directory (one run: layout in :mod:`locos_tl.rundir`); one JSON
            line per finished trial is appended to ``trials.jsonl`` and ``meta.json``
            holds provenance; rerunning with the same settings and trials skips finished
            trials; method folders of methods not in this run are removed.
        seed: bootstrap seed (decoding is greedy, hence deterministic).
        gate_threshold: ROUGE-1 recall a response must exceed to count.
        progress: show a tqdm bar over trials.
        prefill_mode, chunk_size: see :func:`locos_tl.decode.prefill`.
        stop_rule: ``"newline_token"`` (default, the authors' release: only the bare
            newline token stops) or ``"contains_newline"``; recorded in ``meta.json``.
        thinking: skip a ``<think> ... </think>`` block before the stop rule, the gate
            and the answer steps (default); recorded in ``meta.json``.
        spans: per-method override of the span a method reads, e.g.
            ``{"locos": "answer"}`` (``"needle"``: the whole needle; ``"answer"``: the
            answer part, NIAH ``real_needle``; :meth:`Trial.span`). Default: each
            method's published choice (``Detector.span``); recorded in ``meta.json``.
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
        dict of them keyed by method. Trials whose logits or phi turn NaN/inf are
        dropped (``"non_finite"``, with a ``RuntimeWarning``); with no accepted trial a
        ``RuntimeWarning`` gives the drop counts and rankings refuse.

    Raises:
        ValueError: unknown method, variant or span, or a span override for a method
            that is not scored.
        TrialError: a trial does not fit the model (checked before any decoding).
        LocosError: ``out_dir`` holds a run made with other settings or over another
            trial set (the message names both trial-set hashes).
        DistributedError: ``workers`` > 1 without Ray installed (says how to install it).
    """
    if isinstance(methods, str):  # one name, as methods=[name] (a dict is returned)
        methods = [methods]
    if not isinstance(method, str):
        raise ValueError(f"method must be one method name, got {method!r}; pass several "
                         "as methods=[...]")
    if workers > 1 or ray_address is not None or distributed_kwargs:
        from locos_tl.distributed import score_trials_distributed

        return score_trials_distributed(  # the workers load `model` (name, path or bridge's)
            model, trials, workers=workers, ray_address=ray_address,
            method=method, methods=methods, variant=variant, max_new_tokens=max_new_tokens,
            out_dir=out_dir, seed=seed, gate_threshold=gate_threshold, progress=progress,
            prefill_mode=prefill_mode, chunk_size=chunk_size, stop_rule=stop_rule,
            thinking=thinking, spans=spans, **distributed_kwargs,
        )
    names = list(methods) if methods is not None else [method]
    if not names:
        raise ValueError("no method given")
    spans = check_spans(spans, names)
    detectors = [get_detector(m, span=spans.get(m)) for m in names]  # type: ignore[arg-type]
    variant = check_variant(variant)
    trials = list(trials)
    if not trials:
        raise ValueError("no trials to score")
    if as_int(max_new_tokens, "max_new_tokens") < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    stop_rule = check_stop_rule(stop_rule)
    check_trials_fit(model, trials, max_new_tokens)
    directions = AnswerDirections(model, variant) if any(d.needs_phi for d in detectors) else None
    settings = run_settings(model_name(model), model_dtype(model), variant=variant,
                            methods=names, max_new_tokens=max_new_tokens,
                            gate_threshold=gate_threshold, seed=seed, trials=trials,
                            stop_rule=stop_rule, thinking=thinking,
                            spans=method_spans(detectors))
    store = RecordStore(out_dir, settings, RESUME_KEYS) if out_dir is not None else None
    meta = provenance(model, settings)
    if store is not None:
        store.write_meta(meta)
        prune_stale_methods(out_dir, names)  # the run's other outputs follow meta.json
    records: list[dict[str, Any]] = []
    for trial in tqdm(trials, desc="scoring trials", unit="trial", disable=not progress):
        rec = finished_record(store, trial, names, method_spans(detectors))
        if rec is None:
            rec = run_trial(model, trial, detectors, directions=directions,
                            max_new_tokens=max_new_tokens, gate_threshold=gate_threshold,
                            prefill_mode=prefill_mode, chunk_size=chunk_size,
                            stop_rule=stop_rule, thinking=thinking)
            if store is not None:
                store.append(rec)
        records.append(rec)
    write_acceptance(store, meta, records, names)
    return aggregate(records, names, model=model, variant=variant, meta=meta, seed=seed,
                     as_dict=methods is not None)


def _span_used(records: Sequence[dict[str, Any]], method: str) -> str | list[str] | None:
    """The span name ``method`` read in ``records`` (a sorted list when they differ)."""
    used = sorted({str(sp) for r in records
                   if (sp := (r.get("spans") or {}).get(method)) is not None})
    return used[0] if len(used) == 1 else (used or None)


def write_acceptance(
    store: RecordStore | None, meta: dict[str, Any], records: Sequence[dict[str, Any]],
    methods: Sequence[str],
) -> None:
    """Add ``acceptance`` (method -> :func:`locos_tl.acceptance.acceptance_counts`) to
    ``meta`` and rewrite ``meta.json`` with it (when there is a run directory)."""
    meta["acceptance"] = {m: acceptance_counts(records, m) for m in methods}
    if store is not None:
        store.write_meta(meta)


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

    Acceptance is per method (:mod:`locos_tl.acceptance`): each method's ``meta`` holds
    its own ``n_trials``, ``n_accepted`` and ``n_dropped_<reason>`` counts, the ``span``
    it read (the span name, or a list when records differ), and ``acceptance`` (every
    method's counts).

    Warns (``RuntimeWarning``, with the drop counts) when a method accepted no trial.
    """
    per_method = {m: acceptance_counts(records, m) for m in methods}
    for m, counts in per_method.items():
        if records and counts["n_accepted"] == 0:
            warnings.warn(
                f"{m}: no trial was accepted: 0 of {counts['n_trials']} ("
                f"{counts['n_dropped_gate']} failed the gate, "
                f"{counts['n_dropped_no_answer_step']} had no answer step, "
                f"{counts['n_dropped_non_finite']} had NaN/inf numbers); every head score "
                "is NaN and rankings (top_k, ranked) refuse", RuntimeWarning, stacklevel=3)
    L, H = int(model.cfg.n_layers), int(model.cfg.n_heads)
    out = {
        m: HeadScores.from_records(
            records, m, n_layers=L, n_heads=H, variant=variant, seed=seed,
            meta={**meta, **per_method[m], "span": _span_used(records, m),
                  "acceptance": per_method})
        for m in methods
    }
    if as_dict is None:
        as_dict = len(methods) > 1
    return out if as_dict else out[methods[0]]
