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

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from locos_tl.acceptance import acceptance_counts
from locos_tl.detectors import SPAN_NAMES, Detector, get_detector
from locos_tl.engine.options import DecodeOptions
from locos_tl.errors import TrialError
from locos_tl.heads import HeadScores
from locos_tl.runs.aggregate import aggregate
from locos_tl.runs.options import ScoreOptions
from locos_tl.runs.records import RecordStore
from locos_tl.runs.rundir import prune_stale_methods

# one trial's decode and record (locos_tl.experiments.score imports them from here)
from locos_tl.runs.trial import non_finite_record, run_trial  # noqa: F401
from locos_tl.trials import Trial, as_trial_list, check_trials_tokenizer, trial_set_hash

RESUME_KEYS = ("model", "dtype", "variant", "max_new_tokens", "gate_threshold", "stop_rule",
               "thinking")


def run_settings(
    model: str, dtype: str, options: ScoreOptions, trials: Sequence[Trial], *,
    spans: dict[str, str] | None = None, model_hashes: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The settings recorded in ``meta.json``: the model, its dtype, the run's options
    (:meth:`ScoreOptions.settings <locos_tl.runs.options.ScoreOptions.settings>`: every
    field under the name runs have always recorded it) and its trial set;
    :data:`RESUME_KEYS` of them must match for a run directory to be resumed
    (single-process and distributed runs alike). ``spans`` (method -> the span name it
    reads, every method) replaces the options' overrides; it is recorded, not a resume
    key: a record made with another span for a method reruns (:func:`finished_record`).
    ``model`` is the model's name and ``model_hashes`` its content hashes (recorded when
    given; the ``model`` key compares both: :mod:`locos_tl.models.identity`).
    :meth:`ScoreOptions.from_settings <locos_tl.engine.options.Options.from_settings>`
    reads the options back."""
    hashes = {"model_hashes": dict(model_hashes)} if model_hashes else {}
    recorded = options.settings()
    if spans is not None:
        recorded["spans"] = dict(spans)
    return {
        "model": model,
        **hashes,
        "dtype": dtype,
        **recorded,
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


def fit_problem(model: Any, trial: Trial, max_new_tokens: int) -> str | None:
    """Why ``trial`` cannot run on ``model`` with ``max_new_tokens`` new tokens (None: it
    can): its prompt plus the new tokens (the last one is never fed) longer than
    ``cfg.n_ctx``, or a token id outside the vocabulary (``cfg.d_vocab``)."""
    n_ctx = getattr(model.cfg, "n_ctx", None)
    if n_ctx and trial.n_tokens + max_new_tokens - 1 > n_ctx:
        return (f"prompt of {trial.n_tokens} tokens + {max_new_tokens} new tokens is longer "
                f"than the model's context n_ctx={n_ctx}")
    d_vocab = int(model.cfg.d_vocab)
    if max(trial.tokens) >= d_vocab or min(trial.tokens) < 0:
        return (f"token id {max(trial.tokens)} outside the model's vocabulary of {d_vocab} "
                "(trials built with another tokenizer?)")
    return None


def check_trials_fit(model: Any, trials: Sequence[Trial], max_new_tokens: int) -> None:
    """Fail before any work when a trial cannot run on ``model``.

    The entry check of the runs outside :mod:`locos_tl.experiments.methods`'s per-trial
    checks (a scoring run's :class:`ScoringRun`, score attribution, cross-model runs).
    Trials built by another tokenizer than the model's are refused first
    (:func:`locos_tl.trials.check_trials_tokenizer`; trials without a tokenizer
    fingerprint run, with one warning); then every trial that does not fit
    (:func:`fit_problem`), all in one error.

    Raises:
        TrialError: a trial built by another tokenizer (the message names both); a
            prompt (+ ``max_new_tokens``) longer than ``n_ctx`` or a token id outside
            the vocabulary (the message names each such trial, index and id).
    """
    for i, t in enumerate(trials):
        if not isinstance(t, Trial):
            raise TrialError(f"trials[{i}] is a {type(t).__name__}, not a Trial (build "
                             "trials with locos_tl.build_*_trials, Trial(...) or load_trials)")
    check_trials_tokenizer(model, trials)
    bad = [(i, t.trial_id, p) for i, t in enumerate(trials)
           if (p := fit_problem(model, t, max_new_tokens)) is not None]
    if bad:
        raise TrialError.of_trials(bad, len(trials))


@dataclass(frozen=True)
class RunOptions:
    """The checked inputs of one scoring run, the same for every executor
    (:func:`check_run_options`; built before any model or Ray work).

    Attributes:
        trials: the trials, in input order (the order of the aggregated scores).
        methods: the method names sharing one decode pass.
        detectors: one detector a method, each reading its span.
        overrides: the per-method span overrides as given (``{"locos": "answer"}``).
        options: the run's :class:`~locos_tl.runs.options.ScoreOptions` (``variant``,
            ``gate_threshold``, ``seed``, ``decode``, ...), as given.
        as_dict: return ``{method: HeadScores}`` (``methods=[...]`` was given).
    """

    trials: tuple[Trial, ...]
    methods: tuple[str, ...]
    detectors: tuple[Detector, ...]
    overrides: dict[str, str]
    options: ScoreOptions
    as_dict: bool

    @property
    def spans(self) -> dict[str, str]:
        """Method -> the span name its detector reads (:func:`method_spans`)."""
        return method_spans(self.detectors)

    @property
    def decode(self) -> DecodeOptions:
        """How each trial is decoded (``options.decode``)."""
        return self.options.decode


def check_run_options(
    trials: Any, options: ScoreOptions, *, as_dict: bool = True,
    where: str = "score_trials",
) -> RunOptions:
    """Check a scoring run's trials and methods (every executor calls this once, first;
    the option values themselves were checked when ``options`` was built).

    Args:
        trials: a sequence of :class:`Trial` (one bare Trial is refused).
        options: the run's options; ``options.methods`` share the decode pass.
        as_dict: the run returns ``{method: HeadScores}`` (False: one method's
            :class:`HeadScores`).
        where: the caller's name, for the messages.

    Raises:
        ValueError: no method, an unknown method or span, a span override for a method
            that is not scored, or no trial.
        TrialError: ``trials`` is one bare Trial or holds a non-Trial.
    """
    trials = as_trial_list(trials, where)
    names = list(options.methods)
    if not names:
        raise ValueError("no method given")
    overrides = check_spans(options.span_overrides, names)
    detectors = tuple(get_detector(m, span=overrides.get(m))  # type: ignore[arg-type]
                      for m in names)
    if not trials:
        raise ValueError("no trials to score")
    return RunOptions(trials=tuple(trials), methods=tuple(names), detectors=detectors,
                      overrides=overrides, options=options, as_dict=as_dict)


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
        model_name, dtype, model_hashes: recorded in the settings (:func:`run_settings`;
            :func:`locos_tl.models.load.model_settings` gives the name and hashes).
        out_dir: the run directory (:mod:`locos_tl.runs.rundir`); None: nothing is written.

    Raises:
        TrialError: a trial does not fit the model (:func:`check_trials_fit`).
        LocosError: ``out_dir`` holds a run made with other settings or over another
            trial set.
    """

    def __init__(self, options: RunOptions, model: Any, *, model_name: str, dtype: str,
                 out_dir: str | Path | None = None,
                 model_hashes: dict[str, str] | None = None) -> None:
        o = self.options = options
        self.model = model
        check_trials_fit(model, o.trials, o.decode.max_new_tokens)
        self.out_dir = out_dir
        self.settings = run_settings(
            model_name, dtype, dataclasses.replace(o.options, methods=o.methods), o.trials,
            spans=o.spans, model_hashes=model_hashes)
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
        return aggregate(records, o.methods, model=self.model, variant=o.options.variant,
                         meta=self.meta, seed=o.options.seed, as_dict=o.as_dict)


def write_acceptance(
    store: Any, meta: dict[str, Any], records: Sequence[dict[str, Any]],
    methods: Sequence[str],
) -> None:
    """Add ``acceptance`` (method -> :func:`locos_tl.acceptance.acceptance_counts`) to
    ``meta`` and rewrite ``meta.json`` with it (when there is a run directory)."""
    meta["acceptance"] = {m: acceptance_counts(records, m) for m in methods}
    if store is not None:
        store.write_meta(meta)
