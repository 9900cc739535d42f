"""Head scoring on Ray workers: :func:`score_trials_distributed` and its tasks.

The run's bookkeeping (settings, resume, acceptance, aggregation) is the runner's
(:class:`locos_tl.runs.runner.ScoringRun`), the same a single-process run uses; this module
only ships each trial still to run to a worker (:class:`ScoreTask`) and hands the
records back. It never imports the local executor or :mod:`locos_tl.experiments.score`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from locos_tl.engine.options import DecodeOptions
from locos_tl.runs.distributed.hosts import ModelHost, model_pool_for
from locos_tl.runs.distributed.pool import RayPool, ResultEvent
from locos_tl.runs.distributed.ray_glue import require_ray
from locos_tl.runs.options import ScoreOptions
from locos_tl.tokenize import TokenizerIdentity


@dataclass(frozen=True)
class ScoreSpec:
    """The per-run settings of a scoring task (hashable: the worker caches its detectors
    and answer directions under it).

    Attributes:
        methods: the checked method names sharing the decode pass.
        variant: ``"raw"`` or ``"exact"``.
        gate_threshold: the ROUGE-1 recall a response must exceed.
        spans: per-method span overrides, sorted ``(method, span)`` pairs.
        decode: how each trial is decoded (:class:`~locos_tl.engine.options.DecodeOptions`).
    """

    methods: tuple[str, ...]
    variant: str
    gate_threshold: float
    spans: tuple[tuple[str, str], ...] = ()
    decode: DecodeOptions = field(default_factory=DecodeOptions)


@dataclass(frozen=True)
class ScoreTask:
    """One trial to score on a :class:`ModelHost`: returns its record (see
    :func:`locos_tl.runs.runner.run_trial`)."""

    spec: ScoreSpec
    trial: Any

    def __call__(self, host: ModelHost) -> dict[str, Any]:
        from locos_tl.detectors import get_detector
        from locos_tl.engine.unembed import AnswerDirections
        from locos_tl.runs.runner import run_trial

        s = self.spec
        state = host.cache.get(s)
        if state is None:
            over = dict(s.spans)
            detectors = [get_detector(m, span=over.get(m)) for m in s.methods]  # type: ignore[arg-type]
            needs_phi = any(d.needs_phi for d in detectors)
            directions = AnswerDirections(host.model, s.variant) if needs_phi else None
            state = host.cache[s] = (detectors, directions)
        detectors, directions = state
        return run_trial(host.model, self.trial, detectors, directions=directions,
                         decode=s.decode, gate_threshold=s.gate_threshold)


@dataclass(frozen=True)
class EnginePathsTask:
    """Which prefill and decode paths a worker's model takes
    (:func:`locos_tl.engine.forward.engine_paths`), for ``meta["engine"]``."""

    prefill_mode: str = "auto"
    decode_engine: str = "auto"

    def __call__(self, host: ModelHost) -> dict[str, Any]:
        from locos_tl.engine.forward import engine_paths

        return engine_paths(host.model, self.prefill_mode, self.decode_engine)


def score_trials_distributed(
    model_name_or_path: Any,
    trials: Sequence[Any],
    options: ScoreOptions | None = None,
    *,
    method: str | None = None,
    workers: int = 2,
    ray_address: str | None = None,
    load_kwargs: dict[str, Any] | None = None,
    out_dir: str | Path | None = None,
    progress: bool = True,
    pool: RayPool | None = None,
    on_record: Callable[[ResultEvent], None] | None = None,
    on_resume: Callable[[int, int], None] | None = None,
    **kwargs: Any,
) -> Any:
    """:func:`locos_tl.experiments.score.score_trials` on ``workers`` Ray actors; identical results.

    Each actor loads the model once (``load_model(model_name_or_path, **load_kwargs)``),
    one GPU each when the cluster has GPUs. Trials are dispatched from one queue;
    records stream back and are appended to ``out_dir/trials.jsonl`` as they arrive,
    under the same settings and resume rules as a single-process run. Scores are
    aggregated from the records in input trial order, so they equal the single-process
    scores exactly (decoding is greedy; use the same dtype and device kind).

    Args:
        model_name_or_path: hub name or local model directory, readable by every worker
            (on a multi-node cluster: the same path on every node, or a hub name); a
            loaded bridge is accepted (its recorded path and dtype are used). Ignored
            when ``pool`` is given.
        trials: the trials (:class:`~locos_tl.trials.Trial`).
        workers: number of actors (ignored when ``pool`` is given).
        ray_address: a running cluster's address; None: a local cluster for this run
            (or Ray already initialised in this process).
        load_kwargs: :func:`locos_tl.load_model` arguments (``dtype``, ``device``,
            ``device_map``); default: float32, CUDA when the worker has a GPU.
        options: the run's :class:`~locos_tl.runs.options.ScoreOptions` (None: defaults).
        method: one method name (a :class:`HeadScores` is returned); not beside
            ``methods=``.
        out_dir, progress, on_resume: as in
            :func:`~locos_tl.experiments.score.score_trials`.
        pool: an open :func:`model_pool` to run on (left open); default: a pool for
            this call.
        on_record: driver-side callback per finished trial (progress, tests).
        **kwargs: fields of :class:`~locos_tl.runs.options.ScoreOptions` and of its
            ``decode`` (``methods``, ``variant``, ``max_new_tokens``, ``stop_rule``, ...),
            overriding ``options``; the others are :class:`RayPool` options
            (``num_gpus_per_worker``, ``num_cpus_per_worker``, ``max_restarts``,
            ``max_attempts``, ``ray_init_kwargs``).

    Returns:
        :class:`~locos_tl.heads.HeadScores`, or a ``{method: HeadScores}`` dict when
        several methods are asked. ``meta["distributed"]`` records the worker count and
        the trials retried after a worker died.

    Raises:
        DistributedError: Ray missing (says ``pip install "locos_tl[ray]"``), every
            worker died, or a trial keeps crashing workers (finished records stay in
            ``out_dir``: rerun to resume).
        ModelLoadError: the workers cannot load the model.
        TrialError: a trial does not fit the model (checked before any decoding).
        ValueError: unknown method or variant.
        LocosError: ``out_dir`` holds a run made with other settings.
    """
    require_ray()  # no Ray: say how to install it before anything else
    from locos_tl.runs.runner import ScoringRun, check_run_options

    names = set(ScoreOptions.option_names())
    pool_kwargs = {k: v for k, v in kwargs.items() if k not in names}
    given = {k: v for k, v in kwargs.items() if k in names}
    if method is not None:
        if "methods" in given:
            raise ValueError(f"give method or methods, not both (method={method!r}, "
                             f"methods={given['methods']!r}): methods=[...] scores every "
                             "name in it")
        given["methods"] = (method,)
    score = ScoreOptions.from_kwargs(options, where="score_trials_distributed", **given)
    opts = check_run_options(  # unknown method, span, ...: fail before Ray
        trials, score, as_dict=method is None)
    decode = opts.decode
    spec = ScoreSpec(methods=opts.methods, variant=score.variant,
                     gate_threshold=score.gate_threshold,
                     spans=tuple(sorted(opts.overrides.items())), decode=decode)
    with model_pool_for(model_name_or_path, pool, workers=workers, ray_address=ray_address,
                        load_kwargs=load_kwargs, **pool_kwargs) as pool:
        info = pool.info()
        tok = info.get("tokenizer")  # the workers' tokenizer: trials are checked against it
        shape = SimpleNamespace(cfg=SimpleNamespace(
            n_layers=info["n_layers"], n_heads=info["n_heads"], n_ctx=info["n_ctx"],
            d_vocab=info["d_vocab"],
        ), tokenizer_identity=None if tok is None else TokenizerIdentity(**tok))
        # the runner's bookkeeping, as score_trials': run directories interchange
        run = ScoringRun(opts, shape, model_name=info["model_name"],
                         dtype=info["provenance"]["model"]["dtype"], out_dir=out_dir,
                         model_hashes=info.get("model_hashes"))
        meta = dict(info["provenance"])
        meta["engine"] = pool.map([EnginePathsTask(decode.prefill_mode,
                                                   decode.decode_engine)])[0]
        todo = run.start(meta, on_resume)

        def write(ev: ResultEvent) -> None:
            run.keep(ev.index, ev.result)
            if on_record is not None:
                on_record(ev)

        pool.map([ScoreTask(spec, trial) for trial in todo], on_result=write,
                 progress=progress, desc=f"scoring trials ({pool.n_workers} workers)")
        retried = sorted({todo[j].trial_id for j in pool.stats.retried})
        run.meta["distributed"] = {"workers": pool.n_workers,
                                   "ray_address": pool.ray_address,
                                   "retried_trials": retried,
                                   "dead_workers": len(pool.stats.dead_workers)}
    return run.finish()
