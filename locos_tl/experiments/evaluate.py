"""Ablation sweeps: answer quality after ablating the top-k heads of each ranking.

docs/concepts.md (Gema, Alex & Minervini 2026, arXiv 2607.01002): for k in
{1, 5, 10, 20, 50, 100} ablate the k best heads of each method (and the controls:
seeded random heads over 3 seeds, the bottom-k of LOCOS), decode greedily with the
ablation active over the whole prompt and every generated token, and score the
response (ROUGE-L F and NoLiMa ``contains`` by default; MuSiQue and BABILong scorers in
:mod:`locos_tl.experiments.task_metrics`). The specificity control compares the drop on retrieval
with the drop on parametric / arithmetic prompts: :func:`dissociation_score`.

Runs are resumable: every (head set, trial) generation is one JSON line in
``out_dir/trials.jsonl``; identical head sets (across methods or k) are generated once.
``out_dir/jobs.json`` keeps every cell any call asked for, so a directory grown by calls
on different grids reads back as one table
(:func:`locos_tl.experiments.run_table.load_ablation_sweep`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from locos_tl.engine.ablation import (
    AblationMeans,
    ablate,
)
from locos_tl.engine.decode import greedy_decode
from locos_tl.engine.prefix import prompt_prefix, reuse_allowed
from locos_tl.engine.stops import (
    stop_predicate,
)
from locos_tl.engine.teacher_forcing import continuation_logprobs
from locos_tl.errors import warn_caller
from locos_tl.experiments.ablation_plan import RANDOM, _ranking, means_hash, plan_grid
from locos_tl.experiments.dissociation import (  # noqa: F401  (protocol.report's import)
    dissociation_score,
)
from locos_tl.experiments.margin import (
    candidate_token_ids,
    margin_of_logprobs,
    margin_scorable,
)
from locos_tl.experiments.methods import check_trials, fits_decode
from locos_tl.experiments.options import AblationOptions
from locos_tl.experiments.run_table import (
    AblationJob,
    directory_table,
    job_cell,
    read_jobs,
    record_jobs,
)
from locos_tl.experiments.task_metrics import (
    get_scorer,
)
from locos_tl.head_spec import HeadLike
from locos_tl.heads import HeadScores
from locos_tl.models.load import model_dtype, model_settings
from locos_tl.runs.distributed.workers import (
    Workers,
    executor_options,
)
from locos_tl.runs.provenance import provenance
from locos_tl.runs.records import META_FILE, RecordStore
from locos_tl.trials import Trial, as_trial_list, trial_set_hash

RESUME_KEYS = ("model", "dtype", "mode", "means_hash", "max_new_tokens", "stop_at_newline",
               "stop_rule", "thinking")




def ablation_sweep(
    model: Any,
    trials: Any,  # Sequence[Trial]; one bare Trial is refused (as_trial_list)
    head_sets: Mapping[str, Sequence[HeadLike] | HeadScores],
    options: AblationOptions | None = None,
    *,
    means: AblationMeans | None = None,
    out_dir: str | Path | None = None,
    progress: bool = True,
    workers: Workers = 1,
    on_resume: Callable[[int, int], None] | None = None,
    extend: bool = False,
    **kwargs: Any,
) -> pd.DataFrame:
    """Answer quality after ablating each method's top-k heads (docs/concepts.md).

    Every generation is free greedy decoding (at most ``max_new_tokens``) with the
    ablation active at every prompt position and every generated token (the prompt is
    prefilled on the fast SDPA twin with the same interventions as module hooks, or
    through the bridge when a hook the twin cannot run is attached;
    :mod:`locos_tl.engine.interventions`).

    Args:
        model: a TransformerBridge.
        trials: the evaluation trials (e.g. NoLiMa at lengths 1000..16000).
        head_sets: method name -> ranking: a ``HeadScores`` or a ranked list of heads in
            any form of :func:`locos_tl.head_spec.parse_heads` (``(14, 3)``,
            ``"L14H3"``, ``"14-3"``; no head twice). A k beyond a list's length is
            skipped for it with a warning, recorded as ``skipped_k`` in ``meta.json``.
        options: the sweep's :class:`~locos_tl.experiments.options.AblationOptions`
            (None: the defaults), saved in ``meta.json`` as its ``settings``.
        means: calibration means (:func:`locos_tl.calibrate_means`), needed by
            ``query_mean`` and ``output_mean``.
        **kwargs: any field of :class:`~locos_tl.experiments.options.AblationOptions`
            or of its ``decode`` as a keyword, overriding ``options``:
        k: head counts to ablate, each in ``1..n_layers * n_heads``; default: the
            paper's :data:`DEFAULT_KS` (1, 5, 10, 20, 50, 100) up to the model's head
            count. k=0 (no ablation) is always run, as method ``"baseline"``.
        mode: ablation mode (see :func:`locos_tl.ablate`).
        seeds: seeds of the random-heads control (one int or a list).
        random: include the random-heads control (method ``"random"``).
        bottom: bottom-k control source
            (:func:`locos_tl.experiments.ablation_plan.build_jobs`).
        scorer: ``"nolima"`` (``rougeL``, ``contains``), ``"musique"`` (``em``,
            ``f1``), ``"babilong"`` (``substring``), ``"control"`` (``exact_match``,
            ``contains``; the specificity controls) or a callable
            ``(response, trial) -> {metric: value}``.
        max_new_tokens: greedy decoding budget (default 100 tokens, the authors'
            release's evaluation budget; scoring's is 50:
            :data:`~locos_tl.experiments.options.ABLATION_DECODE`).
        chunk_size: prefill query chunk (default 1024; memory ``O(chunk_size x N)`` per
            layer).
        stop_rule: ``"newline_token"`` (default, the authors' release: only the bare
            newline token stops), ``"contains_newline"``, or ``"none"`` (no newline
            stops: multi-line answers such as MuSiQue); see
            :func:`locos_tl.engine.stops.is_newline_stop`. Recorded in ``meta.json``.
        thinking: skip a ``<think> ... </think>`` block before the stop rule and keep
            its text out of the scored response (default). Recorded in ``meta.json``.
        prefill_mode, decode_engine, stop_at_eos: as in
            :class:`~locos_tl.engine.options.DecodeOptions`.
        out_dir: run directory (``trials.jsonl`` generations, ``meta.json`` provenance,
            ``jobs.json`` cells, ``evaluation.csv``); a rerun with the same settings
            skips finished work. ``evaluation.csv`` is the directory's table
            (:func:`locos_tl.experiments.run_table.load_ablation_sweep`): this call's cells
            and those of earlier calls whose generations cover ``trials``.
        progress: show a tqdm bar over (head set, trial) generations.
        workers: where the generations run (:mod:`locos_tl.runs.distributed.workers`):
            1 (default) in this process; ``N > 1`` on N Ray actors; ``RayWorkers(n,
            address=..., ...)``; or an open ``model_pool(...)``. Ray actors load the
            model from the bridge's recorded path and dtype; identical results; needs
            ``pip install "locos_tl[ray]"``. See
            :func:`locos_tl.runs.distributed.generate_ablated_distributed`.
        on_resume: with ``out_dir``, called once before any generation as
            ``on_resume(n_reused, n_generations)``: how many finished generations the
            run reuses (its own reuse rule; ``locos ablate`` prints it).
        extend: let ``out_dir`` hold a run over a subset of ``trials`` (grow a run from
            20 to 60 trials keeping the 20 finished ones); a run over trials outside
            ``trials`` is still refused. ``meta.json`` then describes the larger run.
            ``meta.json`` is the provenance of the last call that generated into
            ``out_dir``: a call that finds every generation recorded leaves it as it is.
        name_margin: also record each generation's teacher-forced name margin under
            the ablation (:func:`locos_tl.experiments.margin.name_margin`, nats; metric
            ``name_margin``), read from the decoding's own prefill KV cache (no second
            prompt forward; on Ray workers too). Default: when every trial has
            distractor needles (``meta["distractor_names"]``). A recorded generation
            without one (say, made by Ray workers before they scored it) gets it teacher
            forced, bit for bit the decoding's (one prompt forward, no decoding;
            :func:`locos_tl.engine.teacher_forcing.continuation_logprobs`), appended
            to ``trials.jsonl`` as the record's later line.
        reuse_prefix: compute each ablated prompt from its lowest ablated layer on one
            unablated prefill per trial (:mod:`locos_tl.engine.prefix`; local executor,
            SDPA twin, a prompt within ``chunk_size``), and each decode step from that
            layer while the generation follows the unablated one (models without
            sliding-window layers): the same tokens and logits as recomputing it all,
            which ``False`` does. Under hooks attached before the call (an outer
            :func:`locos_tl.ablate`, a steering hook) it is turned off, with one
            ``UserWarning`` (:func:`locos_tl.engine.prefix.reuse_allowed`): the sweep
            runs under those hooks plus its own ablation, as with ``False``.
        prefix_bytes: cap on the ``resid_pre`` kept per trial (bytes, highest layers
            first); a head set starting beyond it recomputes the prompt.
        ci: confidence level of the bootstrap intervals over trials, in (0, 1), e.g.
            0.95; None: no interval columns.

    Returns:
        Tidy DataFrame of this call's cells, one row per (method, k, seed, metric):
        ``value`` is the mean over trials (in [0, 1]), ``n_trials`` the count, and
        with ``ci`` the interval ``ci_low``, ``ci_high`` (same units as ``value``;
        both equal to ``value`` when every trial scores the same). Deterministic
        methods have ``seed = 0``; the baseline row is ``method="baseline", k=0``.

    Raises:
        TypeError: a keyword that is neither an argument nor an option (a near miss is
            named).
        ValueError: unknown mode or scorer; a ``*_mean`` mode without ``means``; ``ci``
            not None nor a level in (0, 1)
            (:func:`locos_tl.experiments.stats.check_confidence`).
        HeadSpecError: (a ``ValueError``) ``head_sets`` is not a dict of rankings; a
            malformed, repeated or out-of-range head; a k or seed that is not an
            integer, a k below 1 or above ``n_layers * n_heads`` (nothing is dropped
            silently).
        TrialError: ``trials`` is one bare Trial (pass a list) or holds a
            non-Trial; trials that do not fit the model or (``name_margin``) lack
            distractor names, all named in one error before any generation
            (:func:`~locos_tl.experiments.methods.check_trials`).
        LocosError: ``out_dir`` holds a run made with other settings or over another
            trial set (with ``extend``: over a trial that is not in ``trials``).
    """
    options = AblationOptions.from_kwargs(options, where="ablation_sweep", **kwargs)
    decode, mode = options.decode, options.mode
    dist = executor_options(workers)
    if mode.endswith("_mean") and means is None:
        raise ValueError(f"mode {mode!r} needs calibration means (locos_tl.calibrate_means)")
    score_fn = get_scorer(options.scorer)
    trials = as_trial_list(trials, "ablation_sweep")
    name_margin = options.name_margin
    if name_margin is None:
        name_margin = bool(trials) and all(t.meta.get("distractor_names") for t in trials)
    check_trials(model, trials, where="ablation_sweep", max_new_tokens=decode.max_new_tokens,
                 checks=(fits_decode, *((margin_scorable,) if name_margin else ())))
    L, H = int(model.cfg.n_layers), int(model.cfg.n_heads)
    k, seeds, jobs, skipped = plan_grid(model, head_sets, options.k, options.seeds,
                                        random=options.random, bottom=options.bottom)
    reuse_prefix = options.reuse_prefix
    if dist is None:  # an outer ablate() or steering hook: recompute (warned once)
        reuse_prefix = reuse_allowed(model, reuse_prefix, "ablation_sweep")
    settings = {  # the options (AblationOptions.settings), as planned for this model
        **model_settings(model), "dtype": model_dtype(model), **options.settings(),
        "means_hash": means_hash(means), "reuse_prefix": bool(reuse_prefix),
        "name_margin": bool(name_margin), "ks": sorted({int(x) for x in k}),
        "seeds": [int(s) for s in seeds], "methods": sorted({j.method for j in jobs}),
        "skipped_k": skipped,
        "n_trials": len(trials), "trial_set_hash": trial_set_hash(trials),
        "head_sets": {j.key: [list(h) for h in j.heads] for j in jobs},
    }
    store = (RecordStore(out_dir, settings, RESUME_KEYS, trial_field="trial",
                         extend_to={t.trial_id for t in trials} if extend else None)
             if out_dir is not None else None)
    if store is not None:  # the cells first (an unreadable jobs.json fails here)
        _record_cells(out_dir, jobs, head_sets, L, H, fresh=not store.records)

    sets = {j.key: j.heads for j in jobs}  # unique head sets, in job order
    responses: dict[tuple[str, str], str] = {}
    margins: dict[tuple[str, str], float] = {}
    todo = []
    for key in sets:
        for t in trials:
            rec = store.get(f"{key}:{t.trial_id}") if store is not None else None
            if rec is not None:
                responses[(key, t.trial_id)] = rec["response"]
                if rec.get("name_margin") is not None:  # a resumed run keeps its margins
                    margins[(key, t.trial_id)] = rec["name_margin"]
            else:
                todo.append((key, t))
    if store is not None and (todo or not (store.dir / META_FILE).exists()):
        # the provenance of the last call that generates here: a call whose every
        # generation is recorded (a report, a rerun on fewer methods) leaves it as it is
        store.write_meta(provenance(model, settings))
    if on_resume is not None and store is not None:
        on_resume(len(sets) * len(trials) - len(todo), len(sets) * len(trials))

    def keep(key: str, t: Trial, text: str, generated: list[int], stopped_by: str,
             margin: float | None = None) -> None:
        responses[(key, t.trial_id)] = text
        rec = {"trial_id": f"{key}:{t.trial_id}", "heads_key": key, "trial": t.trial_id,
               "n_heads": len(sets[key]), "response": text, "generated": generated,
               "stopped_by": stopped_by}
        if margin is not None:
            margins[(key, t.trial_id)] = rec["name_margin"] = margin
        if store is not None:
            store.append(rec)

    if dist is not None and todo:
        from locos_tl.runs.distributed import generate_ablated_distributed

        def arrived(ev: Any) -> None:
            key, t = todo[ev.index]
            logp = ev.result.get("continuation_logprobs")
            keep(key, t, ev.result["response"], ev.result["generated"],
                 ev.result["stopped_by"],
                 None if logp is None else margin_of_logprobs(t, logp)["name_margin"])

        # the margin's names, tokenized once a trial (a trial has several head sets)
        wanted = {t.trial_id for _, t in todo} if name_margin else set()
        names_of = {t.trial_id: candidate_token_ids(model.tokenizer, t) for t in trials
                    if t.trial_id in wanted}
        generate_ablated_distributed(
            model, [(sets[key], t) for key, t in todo], mode=mode, means=means,
            decode=decode,
            progress=progress, on_result=arrived,
            continuations=[names_of.get(t.trial_id) for _, t in todo],
            **dist,
        )
        todo = []
    pending: dict[str, list[str]] = {}
    for key, t in todo:  # trial by trial, so one unablated prefix serves its head sets
        pending.setdefault(t.trial_id, []).append(key)
    # recorded generations without a margin (made by Ray workers before they scored
    # it): the margin alone, teacher forced from the same prefill
    backfill: dict[str, list[str]] = {}
    for key in sets if name_margin else ():
        for t in trials:
            if (key, t.trial_id) in responses and (key, t.trial_id) not in margins:
                backfill.setdefault(t.trial_id, []).append(key)
    n_fill = sum(map(len, backfill.values()))
    bar = tqdm(total=len(todo) + n_fill, unit="gen", disable=not progress,
               desc=f"ablation ({mode}" + (f"; {n_fill} recorded without a name margin, "
                                           "scored teacher forced)" if n_fill else ")"))
    for t in trials:
        keys, fill = pending.pop(t.trial_id, []), backfill.pop(t.trial_id, [])
        if not keys and not fill:
            continue
        prefix = (prompt_prefix(model, t.tokens, [sets[key] for key in keys + fill],
                                max_bytes=options.prefix_bytes,
                                decode_steps=decode.max_new_tokens if keys else 0,
                                stop=stop_predicate(model, t.tokens,
                                                    stop_rule=decode.stop_rule,
                                                    thinking=decode.thinking))
                  if reuse_prefix else None)
        # the margin's names are scored from the decoding's prefill (one prompt forward
        # per generation)
        names = candidate_token_ids(model.tokenizer, t) if name_margin else None
        for key in keys:
            with ablate(model, list(sets[key]), mode, means=means):
                res = greedy_decode(model, t.tokens, options=decode,
                                    score_continuations=names, prefix=prefix)
            margin = (margin_of_logprobs(t, res.continuation_logprobs)["name_margin"]
                      if name_margin else None)
            keep(key, t, res.text, res.generated, res.stopped_by, margin)
            bar.update(1)
        for key in fill:
            with ablate(model, list(sets[key]), mode, means=means):
                logp = continuation_logprobs(model, t.tokens, names, prefix=prefix,
                                             chunk_size=decode.chunk_size)
            _fill_margin(store, margins, key, t, margin_of_logprobs(t, logp)["name_margin"])
            bar.update(1)
    bar.close()

    per_trial = {t.trial_id: t for t in trials}
    metric_cache: dict[tuple[str, str], dict[str, float]] = {  # floats, as load_ablation_sweep
        kt: {m: float(v) for m, v in score_fn(resp, per_trial[kt[1]]).items()}
        for kt, resp in responses.items()
    }
    for kt, margin in margins.items():  # recorded and new ones
        metric_cache[kt]["name_margin"] = margin
    # this call's cells, from the same table code as the directory's (bit-equal values)
    df = directory_table(None, trials, score_fn, [job_cell(j) for j in jobs],
                         known=metric_cache)
    if options.ci is not None:
        df = _with_intervals(df, directory_table(None, trials, score_fn,
                                                 [job_cell(j) for j in jobs],
                                                 per_trial=True, known=metric_cache),
                             options.ci)
    if out_dir is not None:  # the directory's table: this call's cells and earlier ones
        cells = read_jobs(out_dir)
        table = directory_table(out_dir, trials, score_fn, cells, known=metric_cache)
        table.to_csv(Path(out_dir) / "evaluation.csv", index=False)
        have = set(zip(table["method"], table["k"], table["seed"], strict=True))
        short = [f"{c['method']} k={c['k']}" + (f" seed={c['seed']}" if c["method"] == RANDOM
                                                else "")
                 for c in cells if (c["method"], c["k"], c["seed"]) not in have]
        if short:
            warn_caller(f"{len(short)} cell(s) recorded in {out_dir} lack a generation "
                        f"for some of the {len(trials)} trials and are left out of "
                        f"evaluation.csv ({', '.join(short[:6])}"
                        f"{', ...' if len(short) > 6 else ''}): rerun with those k and "
                        "seeds to fill them")
    return df


def _fill_margin(store: RecordStore | None, margins: dict[tuple[str, str], float],
                 key: str, t: Trial, margin: float) -> None:
    """Keep the name margin of a recorded generation that lacked one: in ``margins`` and
    as the record's later line (the same record with ``name_margin``; later lines win)."""
    margins[(key, t.trial_id)] = margin
    rec = store.get(f"{key}:{t.trial_id}") if store is not None else None
    if rec is not None:
        store.append({**rec, "name_margin": margin})


def _with_intervals(df: pd.DataFrame, per_trial: pd.DataFrame, ci: float) -> pd.DataFrame:
    """``df`` with ``ci_low``, ``ci_high``: each cell's bootstrap interval of the mean
    over its trials (in trial order; :func:`locos_tl.experiments.stats.bootstrap_ci`)."""
    from locos_tl.experiments.stats import bootstrap_ci

    cols = ["method", "k", "seed", "metric"]
    groups = {key: g["value"].to_numpy(dtype=float)
              for key, g in per_trial.groupby(cols, sort=False)}
    bounds = [bootstrap_ci(groups[key], ci) if key in groups else (float("nan"),) * 2
              for key in zip(*(df[c] for c in cols), strict=True)]
    return df.assign(ci_low=[lo for lo, _ in bounds], ci_high=[hi for _, hi in bounds])


def _record_cells(out_dir: str | Path, jobs: Sequence[AblationJob],
                  head_sets: Mapping[str, Sequence[HeadLike] | HeadScores], L: int, H: int,
                  *, fresh: bool) -> None:
    """Record this call's cells in ``jobs.json`` with every ranking in full, so earlier
    cells of a ranking scored anew leave the table (warned)."""
    rankings = {name: _ranking(hs, name, L, H) for name, hs in head_sets.items()}
    for j in jobs:  # the bottom-k control ranks its source from the bottom
        src = j.method.removesuffix("_bottom")
        if j.method.endswith("_bottom") and isinstance(head_sets.get(src), HeadScores):
            rankings[j.method] = head_sets[src].ranked(False)
    dropped = record_jobs(out_dir, jobs, rankings=rankings, fresh=fresh)
    if dropped:
        warn_caller(f"{out_dir}: the rankings given now differ from the ones its earlier "
                    f"cells used; {len(dropped)} earlier cell(s) leave its table "
                    f"({', '.join(f'{m} k={k}' for m, k, _ in dropped[:6])}"
                    f"{', ...' if len(dropped) > 6 else ''}); their generations stay in "
                    "trials.jsonl")
