"""Where a run executes, in one argument: ``workers=1`` (this process), ``workers=N`` (N
Ray actors on a local cluster), :class:`RayWorkers` (every Ray option), or an open
:func:`~locos_tl.runs.distributed.model_pool` (warm workers reused across runs).

Read by :func:`locos_tl.score_trials`, :func:`locos_tl.score_methods` and
:func:`locos_tl.ablation_sweep`. Importing it does not import Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from locos_tl.runs.distributed.pool import RayPool

__all__ = ["RayWorkers", "Workers", "executor_options"]


@dataclass(frozen=True)
class RayWorkers:
    """Ray actors, each holding the model (``pip install "locos_tl[ray]"``).

    Attributes:
        n: number of actors (>= 1).
        address: a running Ray cluster (``"auto"``, ``"ray://host:10001"``); None starts a
            local cluster for the run (or uses Ray already initialised in this process).
        load_kwargs: :func:`locos_tl.load_model` arguments for the workers (``dtype``,
            ``device``, ``device_map``); default: float32, CUDA when the worker has a GPU.
        num_gpus_per_worker, num_cpus_per_worker: Ray resources per actor.
        max_restarts: restarts of a dead actor; max_attempts: tries of one trial.
        ray_init_kwargs: ``ray.init`` arguments for a local cluster (``runtime_env``,
            ``log_to_driver``, ...).
    """

    n: int = 2
    address: str | None = None
    load_kwargs: Mapping[str, Any] | None = None
    num_gpus_per_worker: float | None = None
    num_cpus_per_worker: float | None = None
    max_restarts: int | None = None
    max_attempts: int | None = None
    ray_init_kwargs: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"RayWorkers(n=...) must be an int >= 1, got {self.n!r}")

    def pool_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`~locos_tl.runs.distributed.model_pool` and the
        distributed runners (``workers``, ``ray_address``, ...; unset options left out)."""
        out: dict[str, Any] = {"workers": self.n, "ray_address": self.address}
        for k, v in asdict(self).items():
            if k not in ("n", "address") and v is not None:
                out[k] = dict(v) if isinstance(v, Mapping) else v
        return out


#: what a ``workers=`` argument accepts: a count, :class:`RayWorkers`, or an open
#: ``model_pool(...)`` (:class:`~locos_tl.runs.distributed.RayPool`)
Workers = int | RayWorkers | RayPool


def executor_options(workers: Any) -> dict[str, Any] | None:
    """None for the local executor (``workers=1``), else the distributed runners' keyword
    arguments: ``{"workers": N}`` for a count, :meth:`RayWorkers.pool_kwargs`, or
    ``{"pool": pool}`` for an open model pool.

    Raises:
        TypeError: anything else (the message lists what is accepted).
        ValueError: a count below 1.
    """
    if isinstance(workers, RayWorkers):
        return workers.pool_kwargs()
    if isinstance(workers, RayPool):
        return {"pool": workers}
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise TypeError(f"workers must be an int, RayWorkers(...) or an open model_pool(...), "
                        f"got {type(workers).__name__}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return None if workers == 1 else {"workers": workers}
