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

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, overload

from locos_tl.engine.forward import engine_paths
from locos_tl.engine.options import DecodeOptions
from locos_tl.engine.unembed import AnswerDirections
from locos_tl.experiments.methods import Method, check_trials, get_method
from locos_tl.heads import HeadScores
from locos_tl.models.load import model_dtype, model_settings
from locos_tl.runs.distributed.workers import (
    LEGACY_RAY_OPTIONS,
    Workers,
    executor_options,
    legacy_workers,
)
from locos_tl.runs.options import ScoreOptions
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
from locos_tl.trials import as_trial_list

__all__ = ["RESUME_KEYS", "DecodeOptions", "ScoreOptions", "aggregate", "check_spans",
           "check_trials_fit", "finished_record", "method_spans", "model_dtype",
           "non_finite_record", "run_settings", "run_trial", "score_methods", "score_trials",
           "write_acceptance"]

@overload
def score_trials(model: Any, trials: Any, *, method: str | None = None,
                 **options: Any) -> HeadScores: ...


@overload  # deprecated: several methods are score_methods'
def score_trials(model: Any, trials: Any, *, methods: Sequence[str],
                 **options: Any) -> dict[str, HeadScores]: ...


def score_trials(model: Any, trials: Any, *, method: str | None = None,
                 **options: Any) -> HeadScores | dict[str, HeadScores]:
    """Score every attention head over retrieval trials with one method (default LOCOS).

    LOCOS: Gema, Alex & Minervini 2026, arXiv 2607.01002, Eq. 2-3. The same run as
    :func:`score_methods` with ``methods=[method]``, returning that method's scores.

    Args:
        model: a TransformerBridge (see :func:`locos_tl.load_model`).
        trials: the trials; prompts plus ``max_new_tokens`` must fit in ``n_ctx``.
        method: a name of :data:`~locos_tl.experiments.methods.METHODS`: ``"locos"``
            (default, also for None), ``"wu"``, ``"attention_spatial"``, ``"headkv"``,
            ``"headkv_anchor"``, ``"dla"`` (the shared decode pass), or one with its own
            forward passes: ``"atp"`` (:func:`locos_tl.experiments.atp.atp_heads`),
            ``"qrhead"`` (:func:`locos_tl.experiments.qrhead.qrhead_heads`) or ``"cri"``
            (:func:`locos_tl.experiments.patching.patch_heads`).
        **options: every option of :func:`score_methods` (``out_dir``,
            ``max_new_tokens``, ``variant``, ``workers``, ...).

    Returns:
        :class:`HeadScores`: ``[n_layers, n_heads]`` scores, bootstrap CI and
        per-trial scores.

    Raises:
        TypeError: an unknown keyword (the message names a near miss), or both
            ``method=`` and ``methods=``.
        ValueError, TrialError, LocosError, DistributedError: as :func:`score_methods`.

    ``methods=[...]`` (several methods, the old spelling) still returns the
    :func:`score_methods` dict, with a DeprecationWarning.
    """
    if "methods" in options:  # the old spelling of score_methods: kept, with a warning
        from locos_tl.errors import warn_caller

        if method is not None:
            raise TypeError("score_trials() got both method= and methods=; score_trials "
                            "scores one method and returns HeadScores, score_methods(model, "
                            "trials, methods=[...]) returns a {method: HeadScores} dict")

        warn_caller("score_trials(methods=[...]) is deprecated: score_trials scores one "
                    "method (method=...) and returns HeadScores; score_methods(model, "
                    "trials, methods=[...]) returns the {method: HeadScores} dict",
                    DeprecationWarning)
        return score_methods(model, trials, _caller="score_trials",  # type: ignore[return-value]
                             **options)
    method = "locos" if method is None else method
    return score_methods(model, trials, methods=[method], _caller="score_trials",
                         **options)[method]


def score_methods(
    model: Any,
    trials: Any,  # Sequence[Trial]; one bare Trial is refused (as_trial_list)
    options: ScoreOptions | None = None,
    *,
    out_dir: str | Path | None = None,
    progress: bool = True,
    workers: Workers = 1,
    on_record: Callable[..., None] | None = None,
    on_resume: Callable[[int, int], None] | None = None,
    _caller: str = "score_methods",
    **kwargs: Any,
) -> dict[str, HeadScores]:
    """Score every attention head over retrieval trials with several methods at once.

    LOCOS (Gema, Alex & Minervini 2026, arXiv 2607.01002, Eq. 2-3) and the baselines
    ``wu``, ``headkv``, ``headkv_anchor``, ``attention_spatial`` and ``dla``
    (docs/concepts.md, protocol table) share one decode pass. Each method reads its
    published span and accepts trials by its published rule; ``HeadScores.meta`` holds
    that method's ``span``, ``n_accepted`` and drop counts, and ``acceptance`` (every
    method's counts, also written to ``meta.json``).

    ``atp`` (attribution patching), ``qrhead`` and ``cri`` (activation patching) run
    their own forward passes beside the decode pass, each through its function
    (:meth:`Method.run <locos_tl.experiments.methods.Method.run>`) with that function's
    defaults: of the options here only ``out_dir``, ``progress``, ``on_resume``,
    ``max_new_tokens`` (``atp``, ``cri``: the greedy budget to find the answer) and a
    ``spans`` entry (``qrhead``) apply to them (:attr:`Method.options
    <locos_tl.experiments.methods.Method.options>`); ``batch_size`` (trials decoded
    together) is not CRI's ``batch_size`` (heads patched per forward) and is not passed.
    With ``out_dir`` each keeps its records and scores in ``out_dir/<method>/``; a later
    run of other methods leaves that folder as it is. Ray ``workers`` do not run them
    (``ValueError``).

    Args:
        model: a TransformerBridge (see :func:`locos_tl.load_model`).
        trials: the trials; prompts plus ``max_new_tokens`` must fit in ``n_ctx``.
        options: the run's :class:`~locos_tl.runs.options.ScoreOptions` (methods,
            variant, spans, gate threshold, seed, batch size and the
            :class:`~locos_tl.engine.options.DecodeOptions`); None: the defaults. Saved
            in ``meta.json`` as the run's ``settings``.
        **kwargs: any field of :class:`~locos_tl.runs.options.ScoreOptions` or of its
            ``decode`` as a keyword, overriding ``options``:
            ``methods`` (names of :data:`~locos_tl.experiments.methods.METHODS`, default
            ``("locos",)``; one name as a string is one method), ``variant`` (``"raw"``,
            the paper, or ``"exact"``: norm scales frozen, phi sums to DLA),
            ``max_new_tokens`` (greedy budget per trial, 50 tokens), ``seed`` (bootstrap
            seed; decoding is greedy, hence deterministic), ``gate_threshold`` (ROUGE-1
            recall a response must exceed, 0.5), ``prefill_mode``, ``chunk_size`` (see
            :func:`locos_tl.engine.forward.prefill`), ``stop_rule``, ``thinking``,
            ``spans``, ``decode_engine``, ``batch_size`` (below).
        out_dir: run directory (one run: layout in :mod:`locos_tl.runs.rundir`); one JSON
            line per finished trial is appended to ``trials.jsonl`` and ``meta.json``
            holds provenance; rerunning with the same settings and trials skips finished
            trials. A directory that holds other methods' scores keeps them: those
            methods are scored too, from the same records (a ``UserWarning`` says so),
            as ``locos score`` does.
        progress: show a tqdm bar over trials.
        stop_rule: ``"newline_token"`` (default, the authors' release: only the bare
            newline token stops) or ``"contains_newline"``; recorded in ``meta.json``.
        thinking: skip a ``<think> ... </think>`` block before the stop rule, the gate
            and the answer steps (default); recorded in ``meta.json``.
        spans: per-method override of the span a method reads, e.g.
            ``{"locos": "answer"}`` (``"needle"``: the whole needle; ``"answer"``: the
            answer part, NIAH ``real_needle``; :meth:`Trial.span`). Default: each
            method's published choice (``Detector.span``); recorded in ``meta.json``.
        workers: where the run executes (:mod:`locos_tl.runs.distributed.workers`): 1
            (default) in this process; ``N > 1`` on N Ray actors of a local cluster;
            ``RayWorkers(n, address=..., load_kwargs=..., num_gpus_per_worker=...)`` for
            every Ray option; or an open ``model_pool(...)`` whose warm workers are
            reused. Ray workers load the model from its name/path (``model`` may then be
            that name/path, or a bridge whose recorded path and dtype are reused);
            identical scores; needs ``pip install "locos_tl[ray]"``.
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
        on_record: with Ray workers, a driver-side callback per finished trial
            (:func:`locos_tl.runs.distributed.score_trials_distributed`).
        on_resume: with ``out_dir``, called once before any decoding as
            ``on_resume(n_reused, n_trials)``: how many finished records the run reuses
            (the reuse rule itself, :func:`locos_tl.runs.runner.reused_records`; ``locos
            score`` prints "skipping N of M" from it).

    Returns:
        ``{method: HeadScores}`` (``[n_layers, n_heads]`` scores, CI, per-trial scores)
        for each method asked. Trials whose logits or phi turn NaN/inf are
        dropped (``"non_finite"``, with a ``RuntimeWarning``); with no accepted trial a
        ``RuntimeWarning`` gives the drop counts and rankings refuse.

    Raises:
        ValueError: unknown method (the message lists the registered ones), variant or
            span, a span override for a method that is not scored (or that reads no
            span: ``atp``, ``cri``), or an own-pass method with Ray workers.
        TrialError: ``trials`` is one bare Trial (pass a list) or holds a
            non-Trial; trials that do not fit the model or that a method cannot score
            (a QRHead trial without a question, ...), all named in one error before any
            forward pass (:func:`~locos_tl.experiments.methods.check_trials`).
        LocosError: ``out_dir`` holds a run made with other settings or over another
            trial set (the message names both trial-set hashes).
        DistributedError: ``workers`` > 1 without Ray installed (says how to install it).
        TypeError: an unknown keyword (the message names it and the accepted options).

    The Ray keywords that ``workers=`` now groups (``ray_address=``, ``load_kwargs=``,
    ``num_gpus_per_worker=``, ..., ``pool=``) still work, with a DeprecationWarning
    (:func:`locos_tl.runs.distributed.workers.legacy_workers`).
    """
    legacy = {k: kwargs.pop(k) for k in list(kwargs) if k in LEGACY_RAY_OPTIONS}
    workers = legacy_workers(workers, legacy, _caller)  # the old Ray keywords: warned
    unknown = {k: v for k, v in kwargs.items() if k not in ScoreOptions.option_names()}
    if unknown:
        import difflib

        accepted = sorted([*ScoreOptions.option_names(), *_FRONT])
        # a near-miss names its option; a Ray option, exact or near, says where it goes
        near = {k: (difflib.get_close_matches(k, [*accepted, *LEGACY_RAY_OPTIONS], n=1)
                    or [k])[0] for k in unknown}
        spelled = [f"did you mean {v} for {k}?" for k, v in near.items() if v != k]
        grouped = sorted({v for v in near.values() if v in LEGACY_RAY_OPTIONS})
        hint = "".join(f"; {h}" for h in spelled) + (
            f"; {', '.join(grouped)}: Ray options go in one argument, "
            "workers=RayWorkers(n, address=..., load_kwargs=..., ...) or "
            "workers=model_pool(...)" if grouped else "")
        raise TypeError(f"{_caller}() got unknown keyword(s) {sorted(unknown)}{hint}; "
                        f"accepted options: {', '.join(accepted)}")
    options = ScoreOptions.from_kwargs(options, where=_caller, **kwargs)
    dist = executor_options(workers)
    spans = options.span_overrides
    decode, batch_size = options.decode, options.batch_size
    methods = list(options.methods)
    own = [m.name for m in map(get_method, methods) if not m.decode_pass]  # names checked
    if own:  # their own forwards, beside the shared decode pass
        if dist is not None:
            raise ValueError(f"{', '.join(own)} run in this process only: use workers=1")
        shared = [m for m in methods if m not in own]
        rest = {k: v for k, v in spans.items() if k not in own}
        for m in own:  # refused before any work
            _own_span(get_method(m), spans)
        trials = as_trial_list(trials, _caller)
        check_trials(model, trials, methods, where=_caller, spans=spans,
                     max_new_tokens=decode.max_new_tokens)  # every method's, before any forward
        result = score_methods(
            model, trials, dataclasses.replace(options, methods=tuple(shared), spans=rest),
            out_dir=out_dir, progress=progress, on_resume=on_resume,
            _caller=_caller) if shared else {}
        given = dict(out_dir=out_dir, max_new_tokens=decode.max_new_tokens,
                     progress=progress, on_resume=on_resume)
        for m in own:
            result[m] = _own_passes(get_method(m), model, trials, spans, **given)
        return {m: result[m] for m in methods}
    keep = _kept(out_dir, methods)  # a rescoring with fewer methods deletes nothing
    if keep:
        methods = keep + kept_methods(out_dir, keep)
    options = dataclasses.replace(options, methods=tuple(methods))
    if dist is not None:  # the Ray executor
        if batch_size > 1:
            from locos_tl.errors import warn_caller

            warn_caller(f"batch_size={batch_size} is not used by the Ray executor: each "
                        "worker decodes one trial at a time (same records)", RuntimeWarning)
        from locos_tl.runs.distributed import score_trials_distributed

        return _requested(score_trials_distributed(  # the workers load `model`
            model, trials, options, out_dir=out_dir, progress=progress,
            on_resume=on_resume, on_record=on_record, **dist), keep)
    opts = check_run_options(trials, options, where=_caller)
    check_trials(model, opts.trials, opts.methods, where=_caller, spans=spans,
                 max_new_tokens=decode.max_new_tokens)  # every trial, before any forward
    identity = model_settings(model)
    run = ScoringRun(opts, model, model_name=identity["model"], dtype=model_dtype(model),
                     out_dir=out_dir, model_hashes=identity.get("model_hashes"))
    meta = provenance(model)
    # which paths run
    meta["engine"] = engine_paths(model, decode.prefill_mode, decode.decode_engine)
    if batch_size > 1:  # batched decoding, or why it fell back to one trial at a time
        from locos_tl.runs.batch import batch_fallback_reason

        why = batch_fallback_reason(model, decode.prefill_mode, decode.decode_engine)
        meta["engine"].update(batch_size=1 if why else batch_size, batch_reason=why)
    todo = run.start(meta, on_resume)
    directions = (AnswerDirections(model, options.variant)
                  if any(d.needs_phi for d in opts.detectors) else None)

    from locos_tl.runs.local import run_trials_local  # the local executor

    run_trials_local(model, todo, opts.detectors, directions=directions, decode=decode,
                     gate_threshold=options.gate_threshold, on_record=run.keep,
                     progress=progress, run_trial=run_trial,  # this module's name: patchable
                     batch_size=batch_size, chunk=max(len(todo), 1) if batch_size > 1 else 1)
    return _requested(run.finish(), keep)


#: score_methods' keywords besides the options' fields (for the unknown-keyword message)
_FRONT = ("out_dir", "progress", "workers", "on_record", "on_resume")


def _own_span(method: Method, spans: dict[str, str] | None) -> str | None:
    """The span an own-pass method reads: its ``spans`` override, else its default.

    Raises:
        ValueError: an override for a method that reads no span, or an unknown span.
    """
    if method.name not in (spans or {}):
        return method.default_span
    span = spans[method.name]  # type: ignore[index]
    if not method.spans:
        raise ValueError(f"{method.name} reads no span (got spans={{{method.name!r}: "
                         f"{span!r}}}): it patches every position of the corrupted needle")
    if span not in method.spans:
        raise ValueError(f"unknown span {span!r} for {method.name}; use one of "
                         f"{', '.join(method.spans)}")
    return span


def _own_passes(method: Method, model: Any, trials: list[Any],
                spans: dict[str, str] | None, *, out_dir: str | Path | None,
                **given: Any) -> HeadScores:
    """Score an own-pass method through its function with the options of ``given``
    (``score_methods``' own) it declares (:attr:`Method.options`) and its span; with
    ``out_dir``, its records and saved scores go to ``out_dir/<method>/`` (resumable)."""
    run_dir = None if out_dir is None else Path(out_dir) / method.name
    options = {k: v for k, v in {**given, "out_dir": run_dir}.items()
               if k in method.options}
    if method.spans:
        options["span"] = _own_span(method, spans)
    hs = method.run(model, trials, **options)
    if run_dir is not None:
        hs.save(run_dir)
    return hs


def _kept(out_dir: str | Path | None, requested: list[str]) -> list[str] | None:
    """The requested methods when ``out_dir`` holds scores of other methods
    (:func:`locos_tl.runs.rundir.kept_methods`), which are then scored too and said so
    (``UserWarning``); else None."""
    if out_dir is None:
        return None
    extra = kept_methods(out_dir, requested)
    if not extra:
        return None
    from locos_tl.errors import warn_caller

    warn_caller(f"{out_dir} also holds {', '.join(extra)} scores (an earlier run): kept "
                "and brought up to date from the same trial records; use a new out_dir "
                f"for a run of {', '.join(requested)} alone", UserWarning)
    return requested


def _requested(result: dict[str, HeadScores],
               keep: list[str] | None) -> dict[str, HeadScores]:
    """The requested part of a run that also scored the methods ``out_dir`` held."""
    return result if keep is None else {m: result[m] for m in keep}
