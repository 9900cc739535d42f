"""Data-parallel runs on Ray: one model-holding actor per worker, items from a shared queue."""

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
from locos_tl.runs.distributed.workers import RayWorkers, Workers, executor_options

__all__ = [
    "RAY_INSTALL_HINT",
    "AblatedGenerationTask",
    "DistributedError",
    "EnginePathsTask",
    "ModelHost",
    "ModelLoader",
    "PoolStats",
    "RayPool",
    "RayWorkers",
    "ResultEvent",
    "ScoreSpec",
    "ScoreTask",
    "Workers",
    "executor_options",
    "generate_ablated_distributed",
    "map_trials_distributed",
    "model_pool",
    "require_ray",
    "score_trials_distributed",
    "worker_model_source",
]
