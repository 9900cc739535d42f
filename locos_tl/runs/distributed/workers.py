"""Where a run executes, in one argument: ``workers=1`` (this process), ``workers=N`` (N
Ray actors on a local cluster), :class:`RayWorkers` (every Ray option), or an open
:func:`~locos_tl.runs.distributed.model_pool` (warm workers reused across runs).

Read by :func:`locos_tl.score_trials`, :func:`locos_tl.score_methods` and
:func:`locos_tl.ablation_sweep`. Importing it does not import Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from locos_tl.errors import warn_caller
from locos_tl.runs.distributed.pool import RayPool

__all__ = ["LEGACY_RAY_OPTIONS", "RayWorkers", "Workers", "executor_options", "legacy_workers"]


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


#: the Ray keywords that ``score_trials``, ``score_methods`` and ``ablation_sweep`` took
#: before ``workers=`` grouped them; still accepted, with a DeprecationWarning
LEGACY_RAY_OPTIONS: tuple[str, ...] = (
    "ray_address", "load_kwargs", "num_gpus_per_worker", "num_cpus_per_worker",
    "max_restarts", "max_attempts", "ray_init_kwargs", "pool")


def legacy_workers(workers: Any, legacy: Mapping[str, Any], caller: str) -> Any:
    """The ``workers=`` value that the old Ray keywords meant (``ray_address=``,
    ``load_kwargs=``, ..., ``pool=``), with a DeprecationWarning that names the new
    spelling; no old keyword: ``workers`` unchanged.

    ``workers=N, ray_address=A, load_kwargs=K`` becomes ``RayWorkers(N, address=A,
    load_kwargs=K)``; ``pool=P`` becomes ``P``. The results are the same.

    Raises:
        TypeError: an old keyword beside ``workers=RayWorkers(...)`` or a pool (one
            option given twice), or ``pool=`` beside another Ray option.
    """
    legacy = {k: v for k, v in legacy.items() if v is not None}
    if not legacy:
        return workers
    # named at the user's call (score_trials reaches here through score_methods)
    warn_caller(f"{caller}(): {', '.join(f'{k}=' for k in sorted(legacy))} "
                "deprecated; Ray options go in one argument, workers=RayWorkers(n, "
                "address=..., load_kwargs=..., ...) or workers=model_pool(...)",
                DeprecationWarning)
    if not isinstance(workers, int) or isinstance(workers, bool):
        raise TypeError(f"{caller}(): {sorted(legacy)} given beside workers="
                        f"{type(workers).__name__}(...); put every Ray option in workers=")
    if "pool" in legacy:
        if len(legacy) > 1:
            raise TypeError(f"{caller}(): pool= holds its own Ray options; "
                            f"{sorted(set(legacy) - {'pool'})} cannot be added to it")
        return legacy["pool"]
    names = {f.name for f in fields(RayWorkers)}
    opts = {("address" if k == "ray_address" else k): v for k, v in legacy.items()}
    return RayWorkers(workers, **{k: v for k, v in opts.items() if k in names})
