"""The table of an ablation run directory, rebuilt from its generation records.

:func:`locos_tl.ablation_sweep` keeps one JSON line per (head set, trial) generation in
``trials.jsonl`` and, in ``jobs.json``, every sweep cell (method, k, seed -> head set)
that any call on the directory asked for. Sweeps grow: a first call at k = 5 and 10, a
second at k = 20 with more random seeds, a third that extends the run to 60 trials
(``extend=True``). :func:`load_ablation_sweep` reads the whole directory back as one table,
so no call's cells are lost to a later call on a smaller grid; a cell whose generations
do not cover every trial (a sweep still running, a run grown after it) is left out, never
averaged over fewer trials.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from locos_tl.errors import LocosError, warn_caller
from locos_tl.experiments.methods import current_name
from locos_tl.experiments.task_metrics import Scorer, get_scorer
from locos_tl.runs.records import read_records
from locos_tl.trials import Trial, as_trial_list

if TYPE_CHECKING:
    from locos_tl.heads import Head

@dataclass(frozen=True)
class AblationJob:
    """One cell of the sweep: ablate ``heads`` (the top-``k`` of ``method``)."""

    method: str
    k: int
    seed: int
    heads: tuple[Head, ...]

    @property
    def key(self) -> str:
        return heads_key(self.heads)


def heads_key(heads: Sequence[Head]) -> str:
    """Order-free id of a head set (``"none"`` for no head)."""
    if not heads:
        return "none"
    canon = json.dumps(sorted([int(l), int(h)] for l, h in heads))
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


JOBS_FILE = "jobs.json"
#: one row per (method, k, seed, metric) (``evaluate``'s table)
COLUMNS = ["method", "k", "seed", "metric", "value", "n_trials"]
#: one row per (method, k, seed, trial, metric)
PER_TRIAL_COLUMNS = ["method", "k", "seed", "trial", "metric", "value"]


def read_jobs(out_dir: str | Path) -> list[dict[str, Any]]:
    """The sweep cells recorded in ``out_dir/jobs.json`` (``[]`` if there is none):
    dicts with ``method``, ``k``, ``seed``, ``heads_key`` and ``heads`` (ranked). A cell
    written under a method's old name (``wu_nolima``) comes back under its registered
    one (:func:`~locos_tl.experiments.methods.current_name`).

    Raises:
        LocosError: ``jobs.json`` cannot be read (names the file and the way out).
    """
    path = Path(out_dir) / JOBS_FILE
    if not path.exists():
        return []
    try:
        jobs = json.loads(path.read_text())["jobs"]
        fields = {"method", "k", "seed", "heads_key", "heads"}
        bad = [j for j in jobs if not isinstance(j, dict) or not fields <= j.keys()]
        if bad:
            raise KeyError(f"a cell lacks one of {sorted(fields)}: {bad[0]!r}")
    except (ValueError, KeyError, TypeError) as exc:
        raise LocosError(
            f"{path} is not a readable list of sweep cells ({type(exc).__name__}: {exc}); "
            f"delete it and rerun the evaluate calls on {path.parent} (finished "
            "generations are reused; each call records its cells)") from None
    return [{**j, "method": current_name(j["method"])} for j in jobs]


def job_cell(job: AblationJob) -> dict[str, Any]:
    """One sweep cell as ``jobs.json`` stores it: method, k, seed, heads_key, heads."""
    return {"method": job.method, "k": job.k, "seed": job.seed, "heads_key": job.key,
            "heads": [list(h) for h in job.heads]}


def record_jobs(out_dir: str | Path, jobs: Sequence[AblationJob], *,
                rankings: Mapping[str, Sequence[Head]] | None = None,
                fresh: bool = False) -> list[tuple[str, int, int]]:
    """Add ``jobs`` to ``out_dir/jobs.json``, keeping the cells earlier calls recorded.

    Args:
        out_dir: the run directory.
        jobs: this call's cells (:func:`locos_tl.experiments.ablation_plan.build_jobs`).
        rankings: method -> its full ranking in this call. An earlier cell of one of
            these methods whose head set is not this ranking's top k (the ranking was
            scored anew) leaves the table, so one curve never mixes two rankings; its
            generations stay in ``trials.jsonl``. A cell whose set is the same in
            another order stays (ablating a set does not depend on its order), listed
            in this ranking's order.
        fresh: start the list over (a run directory without a generation yet: cells of
            an attempt that never generated are not this run's).

    Returns:
        The (method, k, seed) cells that left the table.

    Raises:
        LocosError: an existing ``jobs.json`` cannot be read.
    """
    old = [] if fresh else read_jobs(out_dir)
    dropped = []
    cells = {}
    for j in old:
        cell = (j["method"], int(j["k"]), int(j["seed"]))
        ranking = (rankings or {}).get(cell[0])
        if ranking is not None:
            top = [list(h) for h in ranking[:cell[1]]]
            if sorted(top) != sorted(j["heads"]):
                dropped.append(cell)
                continue
            j = {**j, "heads": top}
        cells[cell] = j
    for job in jobs:
        cells[(job.method, job.k, job.seed)] = job_cell(job)
    path = Path(out_dir) / JOBS_FILE
    tmp = path.with_name(path.name + ".tmp")  # a crash never leaves a cut file
    tmp.write_text(json.dumps({"jobs": list(cells.values())}, indent=1))
    os.replace(tmp, path)
    return dropped


def load_ablation_sweep(out_dir: str | Path, trials: Any, scorer: str | Scorer = "nolima", *,
                    per_trial: bool = False) -> pd.DataFrame:
    """Every cell an ablation run directory holds, scored on ``trials`` from its records.

    Args:
        out_dir: a run directory of :func:`locos_tl.ablation_sweep` (``out_dir=``) or
            ``locos ablate``.
        trials: the trials the table is over (the list given to ``evaluate``; with
            ``extend``, the largest). A cell is reported only if the directory holds its
            generation for every one of them.
        scorer: as in :func:`locos_tl.ablation_sweep` (``"nolima"``: ROUGE-L F and
            ``contains``; ``"control"``; ...; or a callable ``(response, trial) ->
            {metric: value}``); the records store responses, so any scorer applies.
        per_trial: one row per (method, k, seed, trial, metric) instead of the mean
            (for paired comparisons and bootstrap intervals over trials).

    Returns:
        ``evaluate``'s tidy table: one row per (method, k, seed, metric), ``value`` the
        mean over trials (in [0, 1] for the built-in scorers: ROUGE-L F-measure, 0/1
        ``contains``), ``n_trials`` their count, in the order the cells were first
        asked for. With ``per_trial``: columns method, k, seed, trial, metric, value.
        Empty (with a warning) when no cell covers ``trials``.

    Raises:
        LocosError: ``out_dir`` has no ``jobs.json`` or one that cannot be read (not an
            ``evaluate`` run, or one written before the cells were recorded: rerunning
            its ``evaluate`` calls there reuses every generation and records them).
        TrialError: ``trials`` is one bare Trial or holds a non-Trial.
        ValueError: unknown scorer.
    """
    trials = as_trial_list(trials, "load_ablation_sweep")
    jobs = read_jobs(out_dir)
    if not jobs:
        raise LocosError(
            f"{out_dir} records no sweep cell (no {JOBS_FILE}): it is not a run "
            "directory of locos_tl.experiments.evaluate, or it was written before runs recorded "
            "their cells; rerun its evaluate calls there (finished generations are "
            "reused; each call records its cells)")
    table = directory_table(out_dir, trials, get_scorer(scorer), jobs, per_trial=per_trial)
    if table.empty and trials:
        warn_caller(f"no cell recorded in {out_dir} has a generation for every one of "
                    f"the {len(trials)} trials given: are they this run's trials?")
    return table


def directory_table(out_dir: str | Path | None, trials: list[Trial], score_fn: Scorer,
                    jobs: list[dict[str, Any]], *, per_trial: bool = False,
                    known: Mapping[tuple[str, str], dict[str, float]] | None = None,
                    ) -> pd.DataFrame:
    """:func:`load_ablation_sweep` on the cells ``jobs`` (dicts as :func:`job_cell` makes);
    ``known`` holds scores already computed ((head-set key, trial id) -> {metric:
    value}), so a record is scored once. ``out_dir`` None: the table of ``known`` alone
    (``evaluate`` without a run directory)."""
    scores = (dict(known or {}) if out_dir is None else
              _scores(out_dir, trials, score_fn, {j["heads_key"] for j in jobs}, known))
    rows = []
    for j in jobs:
        pairs = [(j["heads_key"], t.trial_id) for t in trials]
        if not trials or any(p not in scores for p in pairs):
            continue  # a cell without every trial is not averaged over fewer
        vals = [scores[p] for p in pairs]
        cell = {"method": j["method"], "k": int(j["k"]), "seed": int(j["seed"])}
        if per_trial:
            rows += [{**cell, "trial": t.trial_id, "metric": m, "value": v[m]}
                     for t, v in zip(trials, vals, strict=True) for m in v]
        else:  # np.mean over the trials in order, as evaluate computes its own table
            # a metric every trial has (records from before name_margin lack it)
            common = [m for m in vals[0] if all(m in v for v in vals)]
            rows += [{**cell, "metric": m, "value": float(np.mean([v[m] for v in vals])),
                      "n_trials": len(vals)} for m in common]
    return pd.DataFrame(rows, columns=PER_TRIAL_COLUMNS if per_trial else COLUMNS)


def score_records(out_dir: str | Path, trials: Any,
                  scorer: str | Scorer = "nolima") -> pd.DataFrame:
    """Every generation of a run directory on one of ``trials``, scored: one row per
    (head set, trial, metric), columns ``heads_key``, ``trial``, ``metric``, ``value``.

    For a directory without ``jobs.json``, where only the caller knows which head set
    (:func:`locos_tl.experiments.evaluate.heads_key`) is which cell.

    Raises:
        TrialError: ``trials`` is one bare Trial or holds a non-Trial.
        ValueError: unknown scorer.
    """
    trials = as_trial_list(trials, "score_records")
    scores = _scores(out_dir, trials, get_scorer(scorer))
    return pd.DataFrame([{"heads_key": key, "trial": tid, "metric": m, "value": v}
                         for (key, tid), vals in scores.items() for m, v in vals.items()],
                        columns=["heads_key", "trial", "metric", "value"])


def _scores(out_dir: str | Path, trials: list[Trial], score_fn: Scorer,
            keys: set[str] | None = None,
            known: Mapping[tuple[str, str], dict[str, float]] | None = None,
            ) -> dict[tuple[str, str], dict[str, float]]:
    """(head-set key, trial id) -> {metric: float} for every record on one of ``trials``
    (of a head set in ``keys``, if given); ``known`` scores are reused, not recomputed."""
    by_id = {t.trial_id: t for t in trials}
    out = {}
    for rec in read_records(out_dir).values():
        t = by_id.get(rec.get("trial"))
        key = rec.get("heads_key")
        if t is None or (keys is not None and key not in keys):
            continue
        pair = (key, t.trial_id)
        if known is not None and pair in known:
            out[pair] = dict(known[pair])
        else:
            out[pair] = {m: float(v) for m, v in score_fn(rec["response"], t).items()}
            if rec.get("name_margin") is not None:  # teacher-forced, under the ablation
                out[pair]["name_margin"] = float(rec["name_margin"])
    return out
