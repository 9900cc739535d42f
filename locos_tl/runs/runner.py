"""The single-trial runner and the run bookkeeping shared by every executor.

Data flows one way (docs/architecture.md, "Executors above the runner"): this module
decodes one trial and turns it into a record (:func:`run_trial`), and holds what a run
needs around that, built once for every executor: :func:`check_run_options` (the
checked arguments) and :class:`ScoringRun` (settings and resume keys, reusable records,
acceptance and aggregation into :class:`~locos_tl.heads.HeadScores`). Executors sit
above it and only schedule: the local executor (:mod:`locos_tl.runs.local`) and the Ray executor
(:mod:`locos_tl.runs.distributed`); neither imports the other, and
:func:`locos_tl.experiments.score.score_trials` picks one.

Pipeline per trial (docs/concepts.md): free greedy decoding (at most
``max_new_tokens``, stop at the bare newline token / EOS, a ``<think>`` block
skipped) -> ROUGE-1 recall gate (> 0.5) -> answer steps -> per-step head values of
every detector -> one JSON record. Detector values stay on the device during decoding
and move to the host once per trial.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from locos_tl.acceptance import acceptance_counts
from locos_tl.detectors import SPAN_NAMES, Detector, TrialOutcome, get_detector
from locos_tl.engine.answers import GATE_THRESHOLD, answer_steps, rouge1_recall
from locos_tl.engine.decode import DecodeResult, DecodeStep, greedy_decode
from locos_tl.engine.stops import StopRule, check_stop_rule
from locos_tl.engine.unembed import AnswerDirections, check_variant
from locos_tl.errors import NonFiniteError, TrialError
from locos_tl.head_spec import as_int
from locos_tl.heads import HeadScores
from locos_tl.runs.aggregate import aggregate
from locos_tl.runs.records import RecordStore
from locos_tl.runs.rundir import prune_stale_methods
from locos_tl.trials import Trial, as_trial_list, trial_set_hash

RESUME_KEYS = ("model", "dtype", "variant", "max_new_tokens", "gate_threshold", "stop_rule",
               "thinking")


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
    store: Any, trial: Trial, methods: Sequence[str],
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


@dataclass(frozen=True)
class RunOptions:
    """The checked inputs of one scoring run, the same for every executor
    (:func:`check_run_options`; built before any model or Ray work).

    Attributes:
        trials: the trials, in input order (the order of the aggregated scores).
        methods: the method names sharing one decode pass.
        detectors: one detector a method, each reading its span.
        overrides: the per-method span overrides as given (``{"locos": "answer"}``).
        variant, max_new_tokens, gate_threshold, stop_rule, thinking, seed: as in
            :func:`locos_tl.experiments.score.score_trials`.
        as_dict: return ``{method: HeadScores}`` (``methods=[...]`` was given).
    """

    trials: tuple[Trial, ...]
    methods: tuple[str, ...]
    detectors: tuple[Detector, ...]
    overrides: dict[str, str]
    variant: str
    max_new_tokens: int
    gate_threshold: float
    stop_rule: str
    thinking: bool
    seed: int
    as_dict: bool

    @property
    def spans(self) -> dict[str, str]:
        """Method -> the span name its detector reads (:func:`method_spans`)."""
        return method_spans(self.detectors)


def check_run_options(
    trials: Any, *, method: str | None = None, methods: Sequence[str] | str | None = None,
    spans: dict[str, str] | None = None, variant: str = "raw", max_new_tokens: int = 50,
    gate_threshold: float | None = None, stop_rule: str = "newline_token",
    thinking: bool = True, seed: int = 0, where: str = "score_trials",
) -> RunOptions:
    """Check a scoring run's arguments (every executor calls this once, first).

    Args:
        trials: a sequence of :class:`Trial` (one bare Trial is refused).
        method, methods: one method name, or several sharing the decode pass (one name
            as a string is one method; then a dict is returned); not both. Default
            ``"locos"``.
        gate_threshold: None: :data:`locos_tl.engine.answers.GATE_THRESHOLD`.
        where: the caller's name, for the messages.
        spans, variant, max_new_tokens, stop_rule, thinking, seed: as in
            :func:`locos_tl.experiments.score.score_trials`.

    Raises:
        ValueError: both or no method, an unknown method, variant, span or stop rule,
            a span override for a method that is not scored, no trial, or
            ``max_new_tokens`` < 1.
        TrialError: ``trials`` is one bare Trial or holds a non-Trial.
    """
    trials = as_trial_list(trials, where)
    if isinstance(methods, str):  # one name, as methods=[name] (a dict is returned)
        methods = [methods]
    if method is not None and methods is not None:
        raise ValueError(f"give method or methods, not both (method={method!r}, methods="
                         f"{list(methods)!r}): methods=[...] scores every name in it")
    if method is None:
        method = "locos"
    if not isinstance(method, str):
        raise ValueError(f"method must be one method name, got {method!r}; pass several "
                         "as methods=[...]")
    names = list(methods) if methods is not None else [method]
    if not names:
        raise ValueError("no method given")
    overrides = check_spans(spans, names)
    detectors = tuple(get_detector(m, span=overrides.get(m))  # type: ignore[arg-type]
                      for m in names)
    variant = check_variant(variant)
    if not trials:
        raise ValueError("no trials to score")
    if as_int(max_new_tokens, "max_new_tokens") < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    return RunOptions(
        trials=tuple(trials), methods=tuple(names), detectors=detectors, overrides=overrides,
        variant=variant, max_new_tokens=max_new_tokens,
        gate_threshold=GATE_THRESHOLD if gate_threshold is None else gate_threshold,
        stop_rule=check_stop_rule(stop_rule), thinking=thinking, seed=seed,
        as_dict=methods is not None)


def reused_records(
    store: Any, trials: Sequence[Trial], methods: Sequence[str],
    spans: dict[str, str] | None = None,
) -> list[dict[str, Any] | None]:
    """The reuse rule over a run's trials: each trial's stored record when it can be
    reused (:func:`finished_record`), else None. The one place that decides what a
    resumed run skips, for both executors and for the count a command prints."""
    return [finished_record(store, t, methods, spans) for t in trials]


class ScoringRun:
    """One scoring run's bookkeeping, built once for every executor.

    Executors only schedule: they run :attr:`todo` through :func:`run_trial` (here, or
    on Ray workers), hand each record to :meth:`keep`, and return :meth:`finish`. A run
    directory is then the same whichever executor wrote it (and either resumes it).

    Construction checks that every trial fits ``model`` and opens the run directory
    (settings, resume keys); :meth:`start` writes ``meta.json`` and decides which
    records are reused.

    Args:
        options: the checked run (:func:`check_run_options`).
        model: the bridge, or any object with the workers' model ``cfg`` (``n_layers``,
            ``n_heads``, ``n_ctx``, ``d_vocab``).
        model_name, dtype: recorded in the settings (:func:`run_settings`).
        out_dir: the run directory (:mod:`locos_tl.runs.rundir`); None: nothing is written.

    Raises:
        TrialError: a trial does not fit the model (:func:`check_trials_fit`).
        LocosError: ``out_dir`` holds a run made with other settings or over another
            trial set.
    """

    def __init__(self, options: RunOptions, model: Any, *, model_name: str, dtype: str,
                 out_dir: str | Path | None = None) -> None:
        o = self.options = options
        self.model = model
        check_trials_fit(model, o.trials, o.max_new_tokens)
        self.out_dir = out_dir
        self.settings = run_settings(
            model_name, dtype, variant=o.variant, methods=o.methods,
            max_new_tokens=o.max_new_tokens, gate_threshold=o.gate_threshold, seed=o.seed,
            trials=o.trials, stop_rule=o.stop_rule, thinking=o.thinking, spans=o.spans)
        self.store = (RecordStore(out_dir, self.settings, RESUME_KEYS)
                      if out_dir is not None else None)
        self.meta: dict[str, Any] = {"settings": self.settings}
        self.records: list[dict[str, Any] | None] = [None] * len(o.trials)
        self.todo: list[int] = []

    def start(self, meta: dict[str, Any],
              on_resume: Callable[[int, int], None] | None = None) -> list[Trial]:
        """Write ``meta.json`` (``meta``: provenance, engine paths, ...; the settings
        are added) and remove other methods' outputs; take the reusable records.

        Args:
            meta: the run's provenance (:func:`locos_tl.runs.provenance.provenance`) and
                extras such as ``"engine"``.
            on_resume: called once, with a run directory, as ``on_resume(n_reused,
                n_trials)`` (e.g. to say what a resumed run skips).

        Returns:
            The trials still to run (:attr:`todo`, in input order).
        """
        self.meta = {**meta, "settings": self.settings}
        if self.store is not None:
            self.store.write_meta(self.meta)
            prune_stale_methods(self.out_dir, self.options.methods)  # outputs follow meta
        o = self.options
        self.records = reused_records(self.store, o.trials, o.methods, o.spans)
        self.todo = [i for i, rec in enumerate(self.records) if rec is None]
        if on_resume is not None and self.store is not None:
            on_resume(len(self.records) - len(self.todo), len(self.records))
        return [o.trials[i] for i in self.todo]

    def keep(self, j: int, record: dict[str, Any]) -> None:
        """Store the record of ``todo[j]`` (appended to ``trials.jsonl`` at once)."""
        if self.store is not None:
            self.store.append(record)
        self.records[self.todo[j]] = record

    def finish(self) -> HeadScores | dict[str, HeadScores]:
        """Acceptance into ``meta.json``, and the head scores of every method
        (:func:`aggregate`, records in input trial order)."""
        o = self.options
        records: list[dict[str, Any]] = self.records  # type: ignore[assignment]  # all run
        write_acceptance(self.store, self.meta, records, o.methods)
        return aggregate(records, o.methods, model=self.model, variant=o.variant,
                         meta=self.meta, seed=o.seed, as_dict=o.as_dict)


def non_finite_record(
    trial: Trial, reason: str, detectors: Sequence[Detector] | None = None
) -> dict[str, Any]:
    """The record of a trial whose forward pass produced NaN or inf (logits, or phi of a
    phi-based detector): dropped with reason ``"non_finite"``, and a ``RuntimeWarning``.
    With ``detectors``, also ``dropped_by`` (every method ``"non_finite"``) and
    ``spans`` (method -> span name), as :func:`run_trial` records it."""
    warnings.warn(f"trial {trial.trial_id} dropped (non_finite): {reason}", RuntimeWarning,
                  stacklevel=3)
    rec = {
        "trial_id": trial.trial_id, "n_prompt_tokens": trial.n_tokens,
        "needle_span": list(trial.needle_span), "answer": trial.answer, "response": "",
        "generated": [], "stopped_by": "non_finite", "rouge1_recall": 0.0,
        "accepted": False, "dropped": "non_finite", "non_finite": reason,
        "answer_steps": [], "scores": {}, "step_values": {}, "meta": trial.meta,
    }
    if detectors is not None:
        rec["dropped_by"] = {d.name: "non_finite" for d in detectors}
        rec["spans"] = {d.name: d.span for d in detectors}
    return rec


#: the answer-step acceptance rule (LOCOS) behind a record's ``accepted``/``dropped``
_ANSWER_STEP_RULE = Detector()


class _Collector:
    """One trial's detector inputs, gathered while decoding (kept on the device):
    per-step values, phi's per-step finiteness, prompt-row values."""

    def __init__(self, trial: Trial, detectors: Sequence[Detector]) -> None:
        self.detectors = detectors
        self.per_step: dict[str, list[torch.Tensor]] = {d.name: [] for d in detectors}
        self.needs_phi = any(d.needs_phi for d in detectors)
        self.phi_ok: list[torch.Tensor] = []
        self.spans = {d.name: trial.span(d.span) for d in detectors}
        self.prompt_vals: dict[str, dict[int, torch.Tensor]] = {
            d.name: {} for d in detectors if d.prompt_window}

    def on_step(self, step: DecodeStep) -> None:
        if self.needs_phi:
            self.phi_ok.append(torch.isfinite(step.phi).all())
        for d in self.detectors:
            if d.steps == "prompt" and step.t > 0:  # prompt-only: step 0 is position N-1
                continue
            self.per_step[d.name].append(d.step_value(step, self.spans[d.name]))

    def on_prompt_rows(self, layer: int, rows: torch.Tensor) -> None:
        for d in self.detectors:
            if d.prompt_window:
                self.prompt_vals[d.name][layer] = d.prompt_value(rows, self.spans[d.name])


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
    decode_engine: str = "auto",
) -> dict[str, Any]:
    """Decode one trial and return its record (JSON-serialisable).

    ``stop_rule``, ``thinking`` and ``decode_engine`` as in
    :func:`locos_tl.engine.decode.greedy_decode`; answer steps are searched only after a
    thinking block (``response_start``). Detector values stay on the device while
    decoding and are stacked and moved to the host once per trial.

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
    col = _Collector(trial, detectors)
    window = max((d.prompt_window for d in detectors), default=0)

    try:
        result = greedy_decode(
            model, trial.tokens, max_new_tokens=max_new_tokens, on_step=col.on_step,
            directions=directions, prefill_mode=prefill_mode, chunk_size=chunk_size,
            stop_rule=stop_rule, thinking=thinking, prompt_window=window,
            on_prompt_rows=col.on_prompt_rows if window else None,
            decode_engine=decode_engine,
        )
    except NonFiniteError as exc:
        return non_finite_record(trial, str(exc), detectors)
    return trial_record(model, trial, detectors, result, col, gate_threshold)


def trial_record(
    model: Any,
    trial: Trial,
    detectors: Sequence[Detector],
    result: DecodeResult,
    col: _Collector,
    gate_threshold: float = GATE_THRESHOLD,
) -> dict[str, Any]:
    """A decoded trial's record (fields of :func:`run_trial`), from its decode result
    and the detector values gathered on the device while decoding.

    Args:
        result: the trial's :class:`locos_tl.engine.decode.DecodeResult`.
        col: the detector values gathered while decoding (``col.on_step``,
            ``col.on_prompt_rows``).
        gate_threshold: ROUGE-1 recall gate (strictly above it passes).

    Returns:
        The record; a ``"non_finite"`` record (:func:`non_finite_record`) when a step's
        phi holds NaN or inf. Detector values move to the host in one transfer.
    """
    host = _to_host(col.per_step, col.prompt_vals, col.phi_ok)  # one transfer per trial
    ok = host.pop("__phi_ok__", None)
    if ok is not None and not bool(ok.all()):
        bad = int((~ok).nonzero()[0])
        return non_finite_record(
            trial, str(NonFiniteError(f"decoding step {bad}: phi holds NaN or inf")),
            detectors)
    recall = rouge1_recall(result.text, trial.answer)
    steps = answer_steps(model.tokenizer, result.generated, trial.answer,
                         start=result.response_start)
    outcome = TrialOutcome(
        generated=list(result.generated), response=result.text, answer=trial.answer,
        rouge1_recall=recall, answer_steps=list(steps), gate_threshold=gate_threshold,
        tokenizer=model.tokenizer, response_start=result.response_start,
    )
    dropped = _ANSWER_STEP_RULE.drop_reason(outcome)  # the trial-level accepted/dropped
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
    for d in detectors:
        if dropped_by[d.name] is not None:
            continue
        used = d.used_steps(outcome)
        vals = host[d.name][torch.as_tensor(used, dtype=torch.long)]
        pv_t = host.get(f"__prompt__{d.name}")
        score = d.trial_score(vals, prompt_values=pv_t)
        record["scores"][d.name] = None if score is None else score.tolist()
        if d.steps == "answer":
            record["step_values"][d.name] = vals.tolist()
    return record


def _to_host(
    per_step: dict[str, list[torch.Tensor]],
    prompt_vals: dict[str, dict[int, torch.Tensor]],
    phi_ok: list[torch.Tensor],
) -> dict[str, torch.Tensor]:
    """Stack one trial's device values and move them to the host in one transfer.

    Returns ``{method: [n_steps, n_layers, n_heads]}`` (empty ``[0]`` with no step),
    ``{"__prompt__<method>": [n_layers, n_heads, n_rows]}`` and ``"__phi_ok__"``
    (per-step bool) on the CPU.
    """
    parts: dict[str, torch.Tensor] = {}
    for name, vals in per_step.items():
        if vals:
            parts[name] = torch.stack(vals).to(torch.float32)
    for name, pv in prompt_vals.items():
        if pv:
            parts[f"__prompt__{name}"] = torch.stack([pv[l] for l in sorted(pv)]).float()
    if phi_ok:
        parts["__phi_ok__"] = torch.stack(phi_ok).to(torch.float32)
    out: dict[str, torch.Tensor] = {n: torch.zeros(0) for n in per_step}
    if parts:
        by_device: dict[Any, list[str]] = {}
        for n, t in parts.items():
            by_device.setdefault(t.device, []).append(n)
        for names in by_device.values():
            flat = torch.cat([parts[n].reshape(-1) for n in names]).cpu()  # the one read
            for n, chunk in zip(names, flat.split([parts[n].numel() for n in names]),
                                strict=True):
                out[n] = chunk.view(parts[n].shape)
    if "__phi_ok__" in out:
        out["__phi_ok__"] = out["__phi_ok__"].bool()
    return out


def write_acceptance(
    store: Any, meta: dict[str, Any], records: Sequence[dict[str, Any]],
    methods: Sequence[str],
) -> None:
    """Add ``acceptance`` (method -> :func:`locos_tl.acceptance.acceptance_counts`) to
    ``meta`` and rewrite ``meta.json`` with it (when there is a run directory)."""
    meta["acceptance"] = {m: acceptance_counts(records, m) for m in methods}
    if store is not None:
        store.write_meta(meta)
