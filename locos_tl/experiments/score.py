"""Scoring heads over trials: one greedy decode per trial feeds every detector.

:func:`score_trials` picks an executor -- local (:mod:`locos_tl.runs.local`) or Ray
(:mod:`locos_tl.runs.distributed`) -- above the one trial runner (:mod:`locos_tl.runs.runner`,
whose names are re-exported here: ``run_trial``, ``run_settings``, ``aggregate``, ...).
Both executors take the run's bookkeeping (checked options, settings, resume, acceptance,
aggregation) from the runner's :class:`~locos_tl.runs.runner.ScoringRun`.

Pipeline per trial (docs/concepts.md): free greedy decoding (at most
``max_new_tokens``, stop at the bare newline token / EOS, a ``<think>`` block
skipped) -> ROUGE-1 recall gate (> 0.5) -> answer steps -> per-step head values of
every detector -> one JSON record. Head scores are aggregated from records
(:meth:`HeadScores.from_records`), so resumed runs and runs merged from several
workers aggregate identically.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from locos_tl.engine.answers import GATE_THRESHOLD
from locos_tl.engine.forward import engine_paths
from locos_tl.engine.stops import StopRule
from locos_tl.engine.unembed import AnswerDirections
from locos_tl.head_spec import as_int
from locos_tl.heads import HeadScores
from locos_tl.models.load import model_dtype, model_name
from locos_tl.runs.provenance import provenance
from locos_tl.runs.rundir import kept_methods
from locos_tl.runs.runner import (  # re-exported: the runner's names stay importable from here
    RESUME_KEYS,
    ScoringRun,
    aggregate,
    check_run_options,
    check_spans,
    check_trials_fit,
    finished_record,
    method_spans,
    non_finite_record,
    run_settings,
    run_trial,
    write_acceptance,
)

__all__ = ["RESUME_KEYS", "DISTRIBUTED_OPTIONS", "aggregate", "check_spans", "check_trials_fit",
           "finished_record", "method_spans", "model_dtype", "non_finite_record",
           "run_settings", "run_trial", "score_trials", "write_acceptance"]

#: Keyword options of :func:`score_trials` that only the Ray executor reads.
DISTRIBUTED_OPTIONS: tuple[str, ...] = (
    "load_kwargs", "num_gpus_per_worker", "num_cpus_per_worker", "max_restarts",
    "max_attempts", "ray_init_kwargs", "pool", "on_record")


def score_trials(
    model: Any,
    trials: Any,  # Sequence[Trial]; one bare Trial is refused (as_trial_list)
    *,
    method: str | None = None,
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
    decode_engine: str = "auto",
    batch_size: int = 1,
    workers: int = 1,
    ray_address: str | None = None,
    load_kwargs: dict[str, Any] | None = None,
    num_gpus_per_worker: float | None = None,
    num_cpus_per_worker: float | None = None,
    max_restarts: int | None = None,
    max_attempts: int | None = None,
    ray_init_kwargs: dict[str, Any] | None = None,
    pool: Any = None,
    on_record: Callable[..., None] | None = None,
    on_resume: Callable[[int, int], None] | None = None,
    **unknown: Any,
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
        method: one method name (default ``"locos"``); give either ``method`` or
            ``methods``, not both.
        methods: method names sharing one decode pass (one name as a string is one
            method); then a ``{method: HeadScores}``
            dict is returned (also for a single name).
        variant: ``"raw"`` (paper) or ``"exact"`` (norm scales frozen; phi sums to DLA).
        max_new_tokens: greedy decoding budget per trial.
        out_dir: run directory (one run: layout in :mod:`locos_tl.runs.rundir`); one JSON
            line per finished trial is appended to ``trials.jsonl`` and ``meta.json``
            holds provenance; rerunning with the same settings and trials skips finished
            trials. A directory that holds other methods' scores keeps them: those
            methods are scored too, from the same records (a ``UserWarning`` says so),
            as ``locos score`` does.
        seed: bootstrap seed (decoding is greedy, hence deterministic).
        gate_threshold: ROUGE-1 recall a response must exceed to count.
        progress: show a tqdm bar over trials.
        prefill_mode, chunk_size: see :func:`locos_tl.engine.forward.prefill`.
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
            ``pip install "locos_tl[ray]"``. See :mod:`locos_tl.runs.distributed`.
        decode_engine: ``"auto"`` (default), ``"twin"`` or ``"bridge"``: the engine of
            the decode steps (:func:`locos_tl.engine.forward.step_engine`). The prefill and
            decode paths that ran, with any fallback reason, are recorded in
            ``meta.json`` and ``HeadScores.meta`` under ``"engine"``.
        batch_size: decode this many trials together on the model's plain HF twins
            (:mod:`locos_tl.runs.batch`): left-padded prompts with explicit positions, so
            every record (tokens, responses, per-trial scores within float rounding)
            equals batch size 1's; trials are grouped by prompt length, and one that
            stops early leaves the batch. Falls back to 1 with a ``RuntimeWarning``
            when a hook is attached or no twin exists; recorded in ``meta.json``
            (``engine.batch_size``). Local runs only (the Ray executor warns, runs 1).
        ray_address: a running Ray cluster; None starts a local one for the run.
        load_kwargs, num_gpus_per_worker, num_cpus_per_worker, max_restarts,
            max_attempts, ray_init_kwargs, pool, on_record: Ray executor options
            (:data:`DISTRIBUTED_OPTIONS`, see
            :func:`locos_tl.runs.distributed.score_trials_distributed`); giving one runs
            on Ray.
        on_resume: with ``out_dir``, called once before any decoding as
            ``on_resume(n_reused, n_trials)``: how many finished records the run reuses
            (the reuse rule itself, :func:`locos_tl.runs.runner.reused_records`; ``locos
            score`` prints "skipping N of M" from it).

    Returns:
        :class:`HeadScores` (``[n_layers, n_heads]`` scores, CI, per-trial scores), or a
        dict of them keyed by method. Trials whose logits or phi turn NaN/inf are
        dropped (``"non_finite"``, with a ``RuntimeWarning``); with no accepted trial a
        ``RuntimeWarning`` gives the drop counts and rankings refuse.

    Raises:
        ValueError: unknown method, variant or span, a span override for a method
            that is not scored, or both ``method`` and ``methods`` given.
        TrialError: ``trials`` is one bare Trial (pass a list) or holds a
            non-Trial; a trial does not fit the model (checked before any decoding).
        LocosError: ``out_dir`` holds a run made with other settings or over another
            trial set (the message names both trial-set hashes).
        DistributedError: ``workers`` > 1 without Ray installed (says how to install it).
        TypeError: an unknown keyword (the message names it and the accepted options).
    """
    if unknown:
        import inspect

        accepted = sorted(k for k, p in inspect.signature(score_trials).parameters.items()
                          if p.kind is p.KEYWORD_ONLY)
        raise TypeError(f"score_trials() got unknown keyword(s) {sorted(unknown)}; accepted "
                        f"options: {', '.join(accepted)}")
    dist = {k: v for k, v in dict(
        load_kwargs=load_kwargs, num_gpus_per_worker=num_gpus_per_worker,
        num_cpus_per_worker=num_cpus_per_worker, max_restarts=max_restarts,
        max_attempts=max_attempts, ray_init_kwargs=ray_init_kwargs, pool=pool,
        on_record=on_record).items() if v is not None}
    if as_int(batch_size, "batch_size") < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    keep = _kept(out_dir, method, methods)  # a rescoring with fewer methods deletes nothing
    if keep:
        requested, as_one = keep
        method, methods = None, requested + kept_methods(out_dir, requested)
    run_args = dict(method=method, methods=methods, spans=spans, variant=variant,
                    max_new_tokens=max_new_tokens, gate_threshold=gate_threshold,
                    stop_rule=stop_rule, thinking=thinking, seed=seed)
    if workers > 1 or ray_address is not None or dist:  # the Ray executor
        if batch_size > 1:
            import warnings

            warnings.warn(f"batch_size={batch_size} is not used by the Ray executor: each "
                          "worker decodes one trial at a time (same records)",
                          RuntimeWarning, stacklevel=2)
        from locos_tl.runs.distributed import score_trials_distributed

        return _requested(score_trials_distributed(  # the workers load `model`
            model, trials, workers=workers, ray_address=ray_address, out_dir=out_dir,
            progress=progress, prefill_mode=prefill_mode, chunk_size=chunk_size,
            decode_engine=decode_engine, on_resume=on_resume, **run_args, **dist), keep)
    opts = check_run_options(trials, **run_args)  # type: ignore[arg-type]
    run = ScoringRun(opts, model, model_name=model_name(model), dtype=model_dtype(model),
                     out_dir=out_dir)
    meta = provenance(model)
    meta["engine"] = engine_paths(model, prefill_mode, decode_engine)  # which paths run
    if batch_size > 1:  # batched decoding, or why it fell back to one trial at a time
        from locos_tl.runs.batch import batch_fallback_reason

        why = batch_fallback_reason(model, prefill_mode, decode_engine)
        meta["engine"].update(batch_size=1 if why else batch_size, batch_reason=why)
    todo = run.start(meta, on_resume)
    directions = (AnswerDirections(model, opts.variant)
                  if any(d.needs_phi for d in opts.detectors) else None)

    from locos_tl.runs.local import run_trials_local  # the local executor

    run_trials_local(model, todo, opts.detectors, on_record=run.keep, progress=progress,
                     run_trial=run_trial,  # this module's name: patchable
                     directions=directions, max_new_tokens=opts.max_new_tokens,
                     gate_threshold=opts.gate_threshold, prefill_mode=prefill_mode,
                     chunk_size=chunk_size, stop_rule=opts.stop_rule, thinking=thinking,
                     decode_engine=decode_engine, batch_size=batch_size,
                     chunk=max(len(todo), 1) if batch_size > 1 else 1)
    return _requested(run.finish(), keep)


def _kept(out_dir: str | Path | None, method: str | None,
          methods: str | Sequence[str] | None) -> tuple[list[str], bool] | None:
    """``(requested methods, one method asked)`` when ``out_dir`` holds scores of other
    methods (:func:`locos_tl.runs.rundir.kept_methods`), which are then scored too and
    said so (``UserWarning``); else None."""
    if out_dir is None:
        return None
    if methods is None:
        requested, as_one = [method or "locos"], True
    elif isinstance(methods, str):
        requested, as_one = [methods], False
    else:
        requested, as_one = list(methods), False
    extra = kept_methods(out_dir, requested)
    if not extra:
        return None
    import warnings

    warnings.warn(f"{out_dir} also holds {', '.join(extra)} scores (an earlier run): kept "
                  "and brought up to date from the same trial records; use a new out_dir "
                  f"for a run of {', '.join(requested)} alone", UserWarning, stacklevel=3)
    return requested, as_one


def _requested(result: Any, keep: tuple[list[str], bool] | None) -> Any:
    """The requested part of a run that also scored the methods ``out_dir`` held."""
    if keep is None:
        return result
    requested, as_one = keep
    return result[requested[0]] if as_one else {m: result[m] for m in requested}
