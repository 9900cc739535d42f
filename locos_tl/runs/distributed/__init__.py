"""Data-parallel runs on Ray: one model-holding actor per worker, items from a shared queue.

A study scores hundreds of long trials on 8-32B models; this module spreads them over
several GPUs (or CPU processes) with `Ray <https://docs.ray.io>`_, an optional
dependency (``pip install "locos_tl[ray]"``).

How a run works:

- ``workers`` Ray actors are started, one GPU each when the cluster has GPUs (CPU
  otherwise); each loads the model **once** from its name or path.
- The driver keeps the queue of trials and hands the next one to whichever actor is
  idle (dynamic dispatch with ``ray.wait``), so fast and slow trials balance out.
- Every finished per-trial record streams back to the driver, which appends it to the
  same resumable ``trials.jsonl`` (:class:`~locos_tl.runs.records.RecordStore`) a
  single-process run writes; a rerun skips finished trials, and a single-process run
  can resume a distributed one (and vice versa).
- A worker that dies (killed, out of memory, node lost) loses only the trial in flight:
  that trial goes back to the queue and runs on another worker. A crashed actor is
  restarted by Ray up to ``max_restarts`` times; a trial that kills ``max_attempts``
  workers in a row stops the run (its finished records stay on disk).
- Head scores are aggregated from the records in the input trial order with the same
  code as :func:`locos_tl.experiments.score.score_trials`, so N workers give exactly the
  single-process scores. This is the Ray *executor*: it imports only the trial runner
  (:mod:`locos_tl.runs.runner`), never the local executor or :mod:`locos_tl.experiments.score`.
- Without ``ray_address`` a local Ray cluster is started for the run and shut down at
  its end (a cluster already initialised in this process, e.g. by ``ray.init()`` in a
  notebook, is used and left running).

:func:`map_trials_distributed` is the generic engine (any picklable per-worker function

The package, one concept a module (every name stays importable from
``locos_tl.runs.distributed``):

- :mod:`~locos_tl.runs.distributed.ray_glue`: the optional Ray import and
  :class:`DistributedError`;
- :mod:`~locos_tl.runs.distributed.pool`: :class:`RayPool` (the actors, the queue, retries)
  and :func:`map_trials_distributed`;
- :mod:`~locos_tl.runs.distributed.hosts`: model-holding workers (:func:`model_pool`);
- :mod:`~locos_tl.runs.distributed.scoring`: :func:`score_trials_distributed` (the run's
  bookkeeping and the merge of records are the runner's,
  :class:`locos_tl.runs.runner.ScoringRun`);
- :mod:`~locos_tl.runs.distributed.ablation`: :func:`generate_ablated_distributed`.
"""

from __future__ import annotations

from locos_tl.runs.distributed.ablation import AblatedGenerationTask, generate_ablated_distributed
from locos_tl.runs.distributed.hosts import ModelHost, ModelLoader, model_pool, worker_model_source
from locos_tl.runs.distributed.pool import PoolStats, RayPool, ResultEvent, map_trials_distributed
from locos_tl.runs.distributed.ray_glue import RAY_INSTALL_HINT, DistributedError, require_ray
from locos_tl.runs.distributed.scoring import (
    EnginePathsTask,
    ScoreSpec,
    ScoreTask,
    score_trials_distributed,
)

__all__ = [
    "RAY_INSTALL_HINT",
    "AblatedGenerationTask",
    "DistributedError",
    "EnginePathsTask",
    "ModelHost",
    "ModelLoader",
    "PoolStats",
    "RayPool",
    "ResultEvent",
    "ScoreSpec",
    "ScoreTask",
    "generate_ablated_distributed",
    "map_trials_distributed",
    "model_pool",
    "require_ray",
    "score_trials_distributed",
    "worker_model_source",
]
