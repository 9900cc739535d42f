"""An ablation sweep scored without decoding: answer log-probability and name margin.

For each trial and head set (the cells of :func:`locos_tl.experiments.ablation_plan.build_jobs`:
baseline, top-k of each ranking, random heads, bottom-k) the ablated model scores, teacher
forced right after the prompt,

- ``logp_answer``: the log-probability (nats) of the answer's tokens as they would start
  the response (:func:`locos_tl.experiments.margin.name_prefix`);
- on trials with distractor needles, ``name_margin``: the answer's log-probability minus
  the best distractor name's (nats; :mod:`locos_tl.experiments.margin`).

Each needs one prompt forward, computed from the head set's lowest ablated layer on the
trial's unablated prefill (:mod:`locos_tl.engine.prefix`), and one short forward per name
(:func:`locos_tl.engine.teacher_forcing.continuation_logprobs`). No token is generated,
so there is no ``contains`` or ROUGE: use it where the protocol is a log-probability or a
margin (the paired Wilcoxon test of the distractor protocol, a quick first pass over a
large grid), and :func:`locos_tl.ablation_sweep` for answer accuracy. Its margins equal,
bit for bit, the ones :func:`locos_tl.ablation_sweep` records for the same cells.

Runs are resumable: one JSON line per (head set, trial) in ``out_dir/trials.jsonl``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from locos_tl.engine.ablation import AblationMeans, AblationMode, ablate, check_mode
from locos_tl.engine.continuations import check_continuations
from locos_tl.engine.prefix import DEFAULT_PREFIX_BYTES, prompt_prefix, reuse_allowed
from locos_tl.engine.teacher_forcing import continuation_logprobs
from locos_tl.errors import TrialError
from locos_tl.experiments.ablation_plan import means_hash, plan_grid
from locos_tl.experiments.margin import (
    margin_of_logprobs,
    name_prefix,
    names_token_ids,
    trial_context,
)
from locos_tl.experiments.methods import check_trials, fits_prompt
from locos_tl.head_spec import HeadLike
from locos_tl.heads import HeadScores
from locos_tl.models.load import model_dtype, model_settings
from locos_tl.runs.provenance import provenance
from locos_tl.runs.records import META_FILE, RecordStore
from locos_tl.trials import Trial, as_trial_list, trial_set_hash

__all__ = ["METRICS", "answer_token_ids", "teacher_forced_sweep"]

#: the metrics of a record, in nats
METRICS = ("logp_answer", "name_margin")
RESUME_KEYS = ("model", "dtype", "mode", "means_hash")


def answer_token_ids(tokenizer: Any, trial: Trial) -> list[list[int]]:
    """Token ids of the answer (the needle's character where recorded, else
    ``trial.answer``), then of each distractor name, as the tokenizer writes them right
    after the trial's prompt (:func:`locos_tl.experiments.margin.name_token_ids` with the
    prompt as ``context``).

    Raises:
        TrialError: a name that tokenizes to nothing.
    """
    names = [str(trial.meta.get("character") or trial.answer)]
    names += [str(n) for n in trial.meta.get("distractor_names") or []]
    prefix, context = name_prefix(trial), trial_context(tokenizer, trial)
    return names_token_ids(tokenizer, names, prefix, context=context)


def names_scorable(model: Any, trial: Trial, options: Any = None) -> str | None:
    """Why the names of :func:`answer_token_ids` cannot be scored after ``trial``'s
    prompt (None: they can): a name that tokenizes to nothing, or the prompt plus the
    longest name longer than ``n_ctx``. A per-trial check of
    :func:`locos_tl.experiments.methods.check_trials` (``options`` unused)."""
    try:
        check_continuations(model, trial.n_tokens, answer_token_ids(model.tokenizer, trial),
                            what="name")
    except TrialError as exc:
        return f"trial {trial.trial_id}: {exc}"
    return None


def _record(key: str, n_heads: int, t: Trial, logp: Sequence[float]) -> dict[str, Any]:
    rec: dict[str, Any] = {"trial_id": f"{key}:{t.trial_id}", "heads_key": key,
                           "trial": t.trial_id, "n_heads": n_heads,
                           "logp_answer": float(logp[0])}
    if len(logp) > 1:
        rec.update(margin_of_logprobs(t, logp))
    return rec


def teacher_forced_sweep(
    model: Any,
    trials: Any,
    head_sets: Mapping[str, Sequence[HeadLike] | HeadScores],
    *,
    k: int | Sequence[int] | None = None,
    mode: AblationMode = "query_mean",
    means: AblationMeans | None = None,
    seeds: int | Sequence[int] = (0, 1, 2),
    random: bool = True,
    bottom: str | None = "auto",
    out_dir: str | Path | None = None,
    chunk_size: int = 1024,
    reuse_prefix: bool = True,
    prefix_bytes: int = DEFAULT_PREFIX_BYTES,
    progress: bool = True,
    on_resume: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """The cells of :func:`locos_tl.ablation_sweep`, scored teacher forced (module
    docstring): no decoding.

    Args:
        model: a TransformerBridge.
        trials: the evaluation trials.
        head_sets, k, seeds, random, bottom: the grid, as in
            :func:`locos_tl.ablation_sweep`.
        mode, means: the ablation (:func:`locos_tl.ablate`).
        out_dir: run directory (``trials.jsonl`` records, ``meta.json``); a rerun with
            the same settings and trials skips finished records.
        chunk_size: prefill query chunk.
        reuse_prefix: compute each ablated prompt from its lowest ablated layer on one
            unablated prefill per trial (bit-identical to ``False``, which recomputes
            every prompt). Turned off, with one ``UserWarning``, under hooks attached
            before the call (an outer :func:`locos_tl.ablate`, a steering hook;
            :func:`locos_tl.engine.prefix.reuse_allowed`): every prompt then runs under
            those hooks plus the head set's ablation, as with ``False``.
        prefix_bytes: cap on the ``resid_pre`` kept per trial (bytes).
        progress: a tqdm bar over (head set, trial) pairs.
        on_resume: with ``out_dir``, called once before any work as
            ``on_resume(n_reused, n_cells)``: how many recorded (head set, trial) cells
            the run reuses.

    Returns:
        Tidy DataFrame, one row per (method, k, seed, metric): ``value`` is the mean
        over trials in nats (``logp_answer``; ``name_margin`` where every trial has
        distractor names), ``n_trials`` the count. The baseline row is
        ``method="baseline", k=0``.

    Raises:
        ValueError: unknown mode; a ``*_mean`` mode without ``means``; a malformed head
            set or k, or a ranking of another model or with no accepted trial
            (:func:`locos_tl.experiments.ablation_plan.plan_grid`, as
            :func:`locos_tl.ablation_sweep`).
        TrialError: no trial; a trial does not fit the model; an answer that tokenizes
            to nothing.

    Warns:
        UserWarning: a head set lists fewer heads than a k (that k is skipped for it and
            recorded as ``skipped_k`` in ``meta.json``, as :func:`locos_tl.ablation_sweep`
            does).
        UserWarning: hooks are attached to the model and ``reuse_prefix`` is on (it is
            turned off: ``reuse_prefix=False`` silences this).
        LocosError: ``out_dir`` holds a run with other settings or trials.
    """
    mode = check_mode(mode)
    if mode.endswith("_mean") and means is None:
        raise ValueError(f"mode {mode!r} needs calibration means (locos_tl.calibrate_means)")
    trials = as_trial_list(trials, "teacher_forced_sweep")
    if not trials:
        raise TrialError("teacher_forced_sweep() got no trial: pass a non-empty list")
    ks, seeds, jobs, skipped = plan_grid(model, head_sets, k, seeds, random=random,
                                         bottom=bottom)
    check_trials(model, trials, where="teacher_forced_sweep",
                 checks=(fits_prompt, names_scorable))  # every trial, before any forward
    names = {t.trial_id: answer_token_ids(model.tokenizer, t) for t in trials}
    # an outer ablate() or steering hook: recompute every prompt (warned once)
    reuse_prefix = reuse_allowed(model, reuse_prefix, "teacher_forced_sweep")
    settings = {**model_settings(model), "dtype": model_dtype(model), "mode": mode,
                "means_hash": means_hash(means), "scoring": "teacher_forced",
                "reuse_prefix": bool(reuse_prefix), "ks": sorted({int(x) for x in ks}),
                "seeds": seeds, "skipped_k": skipped, "n_trials": len(trials),
                "trial_set_hash": trial_set_hash(trials),
                "head_sets": {j.key: [list(h) for h in j.heads] for j in jobs}}
    store = (RecordStore(out_dir, settings, RESUME_KEYS, trial_field="trial")
             if out_dir is not None else None)
    sets = {j.key: j.heads for j in jobs}
    records: dict[tuple[str, str], dict[str, Any]] = {}
    todo: dict[str, list[str]] = {}
    for key in sets:
        for t in trials:
            rec = store.get(f"{key}:{t.trial_id}") if store is not None else None
            if rec is not None:
                records[(key, t.trial_id)] = rec
            else:
                todo.setdefault(t.trial_id, []).append(key)
    if store is not None and (todo or not (store.dir / META_FILE).exists()):
        store.write_meta(provenance(model, settings))
    if on_resume is not None and store is not None:
        on_resume(len(records), len(sets) * len(trials))
    bar = tqdm(total=sum(map(len, todo.values())), desc=f"teacher-forced ({mode})",
               unit="cell", disable=not progress)
    for t in trials:
        keys = todo.get(t.trial_id, [])
        prefix = (prompt_prefix(model, t.tokens, [sets[key] for key in keys],
                                max_bytes=prefix_bytes) if reuse_prefix and keys else None)
        for key in keys:
            with ablate(model, list(sets[key]), mode, means=means):
                logp = continuation_logprobs(model, t.tokens, names[t.trial_id],
                                             prefix=prefix, chunk_size=chunk_size)
            rec = _record(key, len(sets[key]), t, logp)
            records[(key, t.trial_id)] = rec
            if store is not None:
                store.append(rec)
            bar.update(1)
    bar.close()
    rows = []
    for j in jobs:
        recs = [records[(j.key, t.trial_id)] for t in trials]
        for metric in METRICS:
            vals = [r[metric] for r in recs if r.get(metric) is not None]
            if len(vals) == len(recs):
                rows.append({"method": j.method, "k": j.k, "seed": j.seed, "metric": metric,
                             "value": sum(vals) / len(vals), "n_trials": len(vals)})
    return pd.DataFrame(rows, columns=["method", "k", "seed", "metric", "value", "n_trials"])
