"""The pool: a fixed set of Ray actors fed one item at a time from a shared queue.

:class:`RayPool` dispatches each item to whichever actor is idle (``ray.wait``), so
fast and slow items balance out; an item whose actor dies goes back to the queue and
runs on another actor, and a crashed actor is restarted by Ray up to ``max_restarts``
times. :func:`map_trials_distributed` is the generic engine on top of it.
"""

from __future__ import annotations

import logging
import os
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from locos_tl.runs.distributed.ray_glue import DistributedError, original_error, require_ray

log = logging.getLogger("locos_tl.runs.distributed")

# -- the actor ------------------------------------------------------------------------


class _Worker:
    """Ray actor body: builds its per-item function once (lazily, so a restarted actor
    rebuilds it) and applies it to one item per call."""

    def __init__(self, factory: Callable[[], Callable[[Any], Any]]) -> None:
        self._factory = factory
        self._fn: Callable[[Any], Any] | None = None

    def setup(self) -> Any:
        """Build the function (e.g. load the model); return its ``info()`` if it has one."""
        if self._fn is None:
            self._fn = self._factory()
        info = getattr(self._fn, "info", None)
        return info() if callable(info) else None

    def run(self, item: Any) -> Any:
        if self._fn is None:
            self.setup()
        assert self._fn is not None
        return self._fn(item)

    def ping(self) -> bool:
        return True


# -- the pool -------------------------------------------------------------------------


@dataclass
class ResultEvent:
    """What :class:`RayPool.map`'s ``on_result`` callback receives for each finished item.

    Attributes:
        index: position of the item in the mapped sequence.
        result: what the worker returned.
        worker: index of the actor that produced it (into ``pool.actors``).
        pool: the pool (``pool.actors`` are the Ray actor handles; ``pool.in_flight``
            maps actor index -> item index for the calls still running).
    """

    index: int
    result: Any
    worker: int
    pool: RayPool


@dataclass
class PoolStats:
    """Counters of one :meth:`RayPool.map` call."""

    completed: int = 0
    retried: list[int] = field(default_factory=list)
    dead_workers: list[int] = field(default_factory=list)


class RayPool:
    """A fixed set of Ray actors, each holding the function ``factory()`` built once.

    Use as a context manager: entering connects to (or starts) Ray and launches the
    actors; leaving kills them and stops a cluster the pool started itself.

    Args:
        factory: a picklable zero-argument callable run once inside each actor; returns
            the per-item function (a callable; an optional ``info()`` method is returned
            by :meth:`info`). Define it in an importable module, not in ``__main__`` of
            a remote cluster's driver.
        workers: number of actors (>= 1).
        ray_address: address of a running Ray cluster (``"auto"``, ``"host:6379"``,
            ``"ray://host:10001"``); None: use Ray already initialised in this process,
            else start a local cluster for the pool's lifetime.
        num_gpus_per_worker: GPUs per actor; None: 1 when the cluster has GPUs, else 0.
            Use 2 for a model split over two GPUs per worker (``device_map="auto"``).
        num_cpus_per_worker: CPUs per actor (Ray also sets its torch threads to this).
        max_restarts: how many times Ray restarts a crashed actor (it reloads the model).
        max_attempts: a single item that crashes this many workers stops the run.
        ray_init_kwargs: extra ``ray.init`` arguments (e.g. ``{"log_to_driver": True}``
            to see the workers' output when debugging).

    Raises:
        DistributedError: Ray is not installed; ``workers`` < 1; not enough GPUs.
    """

    def __init__(
        self,
        factory: Callable[[], Callable[[Any], Any]],
        *,
        workers: int,
        ray_address: str | None = None,
        num_gpus_per_worker: float | None = None,
        num_cpus_per_worker: float = 1,
        max_restarts: int = 1,
        max_attempts: int = 3,
        ray_init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if int(workers) < 1:
            raise DistributedError(f"workers must be >= 1, got {workers}")
        self.factory = factory
        self.n_workers = int(workers)
        self.ray_address = ray_address
        self.num_gpus_per_worker = num_gpus_per_worker
        self.num_cpus_per_worker = num_cpus_per_worker
        self.max_restarts = int(max_restarts)
        self.max_attempts = max(1, int(max_attempts))
        self.ray_init_kwargs = dict(ray_init_kwargs or {})
        self.actors: list[Any] = []
        self.alive: set[int] = set()
        self.in_flight: dict[int, int] = {}
        self.stats = PoolStats()
        self._owns_cluster = False
        self._setup_refs: dict[Any, int] = {}
        self._info: Any = None
        self._ray: Any = None

    # lifecycle ---------------------------------------------------------------
    def __enter__(self) -> RayPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Connect to or start Ray, and launch the actors (each starts loading at once)."""
        ray = self._ray = require_ray()
        if not ray.is_initialized():
            quiet = dict(include_dashboard=False, log_to_driver=False,
                         logging_level=logging.ERROR, configure_logging=True)
            if self.ray_address:  # connect; close() disconnects (the cluster keeps running)
                ray.init(address=self.ray_address, **{**quiet, **self.ray_init_kwargs})
                self._owns_cluster = True
            else:
                cpus = max(os.cpu_count() or 1, int(self.n_workers * self.num_cpus_per_worker))
                ray.init(**{**quiet, "num_cpus": cpus, **self.ray_init_kwargs})
                self._owns_cluster = True
        try:
            gpus = float(ray.cluster_resources().get("GPU", 0))
            per = self.num_gpus_per_worker
            if per is None:
                per = 1 if gpus >= 1 else 0
            if per and self.n_workers * per > gpus:
                raise DistributedError(
                    f"{self.n_workers} workers x {per} GPU(s) need {self.n_workers * per:g} "
                    f"GPUs but the Ray cluster has {gpus:g}; ask for fewer workers"
                )
            cpus_total = float(ray.cluster_resources().get("CPU", 0))
            if self.n_workers * self.num_cpus_per_worker > cpus_total:
                raise DistributedError(
                    f"{self.n_workers} workers x {self.num_cpus_per_worker:g} CPU(s) need "
                    f"{self.n_workers * self.num_cpus_per_worker:g} CPUs but the Ray cluster "
                    f"has {cpus_total:g}; ask for fewer workers or lower num_cpus_per_worker"
                )
            actor_cls = ray.remote(_Worker).options(
                num_cpus=self.num_cpus_per_worker, num_gpus=per,
                max_restarts=self.max_restarts, max_task_retries=0,
            )
            self.actors = [actor_cls.remote(self.factory) for _ in range(self.n_workers)]
            self.alive = set(range(self.n_workers))
            self._setup_refs = {a.setup.remote(): i for i, a in enumerate(self.actors)}
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Kill the actors; stop the local cluster this pool started, or disconnect from
        the cluster it connected to (a Ray session it found initialised is left alone)."""
        ray = self._ray
        if ray is None:
            return
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # already dead
                pass
        self.actors, self.alive, self._setup_refs = [], set(), {}
        if self._owns_cluster and ray.is_initialized():
            ray.shutdown()
        self._owns_cluster = False

    # work --------------------------------------------------------------------
    def info(self) -> Any:
        """``info()`` of the per-item function on the first actor that finished loading.

        Raises:
            Exception: the error a worker raised while loading (e.g. ModelLoadError).
        """
        if self._info is not None:
            return self._info
        ray = self._ray
        while self._setup_refs:
            [ref], _ = ray.wait(list(self._setup_refs), num_returns=1)
            i = self._setup_refs.pop(ref)
            try:
                self._info = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                raise original_error(exc) from None
            except ray.exceptions.RayActorError:
                log.warning("worker %d died while loading", i)
                continue
            return self._info
        raise DistributedError("every worker died while loading the model")

    def wait_ready(self) -> int:
        """Block until every worker has built its function (loaded the model).

        Returns:
            The number of workers alive and ready.

        Raises:
            Exception: the error a worker raised while loading.
        """
        ray = self._ray
        if ray is None:
            raise DistributedError("the pool is not started (use it as a context manager)")
        for ref, i in list(self._setup_refs.items()):
            try:
                info = ray.get(ref)
                if self._info is None:
                    self._info = info
            except ray.exceptions.RayTaskError as exc:
                raise original_error(exc) from None
            except ray.exceptions.RayActorError:
                self.alive.discard(i)
            finally:
                self._setup_refs.pop(ref, None)
        return len(self.alive)

    def map(
        self,
        items: Sequence[Any],
        *,
        on_result: Callable[[ResultEvent], None] | None = None,
        progress: bool = False,
        desc: str = "items",
    ) -> list[Any]:
        """Apply the workers' function to every item; results in input order.

        Items are dispatched one at a time to whichever actor is idle. When an actor
        dies, its item goes back to the front of the queue; the actor is pinged and
        rejoins once Ray has restarted it, or is dropped when it is gone for good.

        Args:
            items: picklable items.
            on_result: called in the driver as each result arrives (e.g. to append it
                to a record file), in completion order.
            progress: show a tqdm bar.
            desc: the bar's label.

        Returns:
            One result per item, in the order of ``items``.

        Raises:
            Exception: the error the function raised on an item (re-raised as is).
            DistributedError: every worker died, or an item crashed ``max_attempts``
                workers.
        """
        ray = self._ray
        if ray is None:
            raise DistributedError("the pool is not started (use it as a context manager)")
        items = list(items)
        results: list[Any] = [None] * len(items)
        queue: deque[int] = deque(range(len(items)))
        attempts: Counter[int] = Counter()
        pending: dict[Any, tuple[str, int, int]] = {
            ref: ("setup", a, -1) for ref, a in self._setup_refs.items()
        }
        self._setup_refs = {}
        idle: deque[int] = deque(sorted(self.alive))
        self.stats = PoolStats()
        bar = tqdm(total=len(items), desc=desc, unit="item", disable=not progress)
        try:
            while queue or any(kind == "run" for kind, _, _ in pending.values()):
                while queue and idle:
                    a, i = idle.popleft(), queue.popleft()
                    pending[self.actors[a].run.remote(items[i])] = ("run", a, i)
                    self.in_flight[a] = i
                if not pending:
                    raise DistributedError(
                        f"every worker died; {len(queue)} of {len(items)} items not done "
                        "(finished records are kept: rerun to resume)"
                    )
                [ref], _ = ray.wait(list(pending), num_returns=1)
                kind, a, i = pending.pop(ref)
                try:
                    value = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:
                    raise original_error(exc) from None
                except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as exc:
                    if kind == "setup":  # its queued run call fails too and is handled there
                        continue
                    if kind == "ping":
                        self.alive.discard(a)
                        self.stats.dead_workers.append(a)
                        log.warning("worker %d is gone; %d left", a, len(self.alive))
                        continue
                    if kind == "run":
                        self.in_flight.pop(a, None)
                        attempts[i] += 1
                        self.stats.retried.append(i)
                        if attempts[i] >= self.max_attempts:
                            raise DistributedError(
                                f"item {i} crashed {attempts[i]} workers; last error: "
                                f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                            ) from exc
                        queue.appendleft(i)
                        log.warning("worker %d died on item %d; retrying it", a, i)
                    # is the actor restarting (ping answers) or gone (ping fails)?
                    pending[self.actors[a].ping.remote()] = ("ping", a, -1)
                    continue
                if kind == "ping":
                    idle.append(a)
                    continue
                if kind == "setup":
                    continue
                self.in_flight.pop(a, None)
                results[i] = value
                idle.append(a)
                self.stats.completed += 1
                bar.update(1)
                if on_result is not None:
                    on_result(ResultEvent(index=i, result=value, worker=a, pool=self))
        finally:
            bar.close()
            self.in_flight.clear()
        return results


def map_trials_distributed(
    factory: Callable[[], Callable[[Any], Any]],
    items: Sequence[Any],
    *,
    workers: int,
    ray_address: str | None = None,
    on_result: Callable[[ResultEvent], None] | None = None,
    progress: bool = False,
    desc: str = "items",
    **pool_kwargs: Any,
) -> list[Any]:
    """Map a per-worker function over items on ``workers`` Ray actors (generic engine).

    For evaluation sweeps, ablations and other per-trial jobs: ``factory()`` runs once
    in each actor (load the model there) and returns ``fn``; each item goes to an idle
    actor as ``fn(item)``. Results come back in input order; ``on_result`` sees each
    one as it arrives (write your resumable record there; skip finished items before
    calling, as :func:`score_trials_distributed` does).

    Args:
        factory: picklable zero-argument callable returning the per-item function.
        items: picklable items (e.g. :class:`~locos_tl.trials.Trial` objects or
            ``(head_set, k, seed, trial)`` tuples).
        workers: number of actors.
        ray_address: a running Ray cluster; None starts a local one for the call.
        on_result: driver-side callback per finished item (a :class:`ResultEvent`).
        progress, desc: a tqdm bar.
        **pool_kwargs: :class:`RayPool` options (``num_gpus_per_worker``,
            ``num_cpus_per_worker``, ``max_restarts``, ``max_attempts``,
            ``ray_init_kwargs``).

    Returns:
        ``[fn(item) for item in items]``, computed on the workers.

    Raises:
        DistributedError: Ray missing, every worker died, or an item keeps crashing
            workers.
    """
    with RayPool(factory, workers=workers, ray_address=ray_address, **pool_kwargs) as pool:
        return pool.map(items, on_result=on_result, progress=progress, desc=desc)
