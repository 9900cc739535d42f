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
  same resumable ``trials.jsonl`` (:class:`~locos_tl.records.RecordStore`) a
  single-process run writes; a rerun skips finished trials, and a single-process run
  can resume a distributed one (and vice versa).
- A worker that dies (killed, out of memory, node lost) loses only the trial in flight:
  that trial goes back to the queue and runs on another worker. A crashed actor is
  restarted by Ray up to ``max_restarts`` times; a trial that kills ``max_attempts``
  workers in a row stops the run (its finished records stay on disk).
- Head scores are aggregated from the records in the input trial order with the same
  code as :func:`locos_tl.score.score_trials`, so N workers give exactly the
  single-process scores. This is the Ray *executor*: it imports only the trial runner
  (:mod:`locos_tl.runner`), never the local executor or :mod:`locos_tl.score`.
- Without ``ray_address`` a local Ray cluster is started for the run and shut down at
  its end (a cluster already initialised in this process, e.g. by ``ray.init()`` in a
  notebook, is used and left running).

:func:`map_trials_distributed` is the generic engine (any picklable per-worker function
over any items); :func:`score_trials_distributed` builds the scorer on it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tqdm.auto import tqdm

from locos_tl.errors import LocosError

RAY_INSTALL_HINT = 'pip install "locos_tl[ray]"'

log = logging.getLogger(__name__)


class DistributedError(LocosError):
    """A distributed run cannot go on: Ray is missing, every worker died, or one trial
    keeps killing its workers. Records finished so far stay in the run directory."""


def require_ray() -> Any:
    """Import and return the ``ray`` module.

    Raises:
        DistributedError: Ray is not installed; the message says how to install it.
    """
    try:
        import ray
    except ImportError as exc:
        raise DistributedError(
            f"running on several workers needs Ray, which is not installed: {RAY_INSTALL_HINT}"
        ) from exc
    return ray


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
                raise _cause(exc) from None
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
                raise _cause(exc) from None
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
                    raise _cause(exc) from None
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


def _cause(exc: Any) -> BaseException:
    """The original exception inside a ``RayTaskError`` (with its message), or ``exc``."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


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


# -- model-holding workers --------------------------------------------------------------


@dataclass(frozen=True)
class ModelLoader:
    """Picklable factory of a model-holding worker: ``ModelLoader(path, kwargs)()`` loads
    the model once (inside the actor) and returns a :class:`ModelHost`.

    Attributes:
        model: hub name or local directory, readable on every worker.
        load_kwargs: :func:`locos_tl.load_model` arguments (``dtype``, ``device``,
            ``device_map``), as a tuple of pairs (hashable).
    """

    model: str
    load_kwargs: tuple[tuple[str, Any], ...] = ()

    def __call__(self) -> ModelHost:
        return ModelHost(self)


class ModelHost:
    """What a worker holds: the loaded bridge plus a cache of per-run state (detectors,
    answer directions, ...). Items sent to it are tasks: ``task(host) -> result``, so one
    warm pool serves scoring, evaluation sweeps and ablations of the same model.

    Attributes:
        model: the TransformerBridge.
        cache: free per-worker cache keyed by a task's (hashable) spec.
    """

    def __init__(self, loader: ModelLoader) -> None:
        from locos_tl.models import load_model

        self.model = load_model(loader.model, **dict(loader.load_kwargs))
        self.cache: dict[Any, Any] = {}

    def info(self) -> dict[str, Any]:
        """Model facts the driver needs without loading the model itself."""
        from locos_tl.models import model_name
        from locos_tl.provenance import provenance

        cfg = self.model.cfg
        return {
            "model_name": model_name(self.model),
            "n_layers": int(cfg.n_layers),
            "n_heads": int(cfg.n_heads),
            "n_ctx": getattr(cfg, "n_ctx", None),
            "d_vocab": int(cfg.d_vocab),
            "provenance": provenance(self.model),
        }

    def __call__(self, task: Callable[[ModelHost], Any]) -> Any:
        return task(self)


def model_pool(
    model: Any,
    *,
    workers: int,
    ray_address: str | None = None,
    load_kwargs: dict[str, Any] | None = None,
    **pool_kwargs: Any,
) -> RayPool:
    """A :class:`RayPool` of ``workers`` actors each holding ``model`` (loaded once).

    Keep it open to reuse warm workers across several runs (e.g. in a notebook)::

        with model_pool("Qwen/Qwen3-8B", workers=4, load_kwargs={"dtype": "bf16"}) as pool:
            a = score_trials_distributed(None, trials_a, pool=pool)
            b = score_trials_distributed(None, trials_b, pool=pool, methods=["wu"])

    Args:
        model: hub name, local directory, or a loaded bridge (see
            :func:`worker_model_source`).
        workers, ray_address, **pool_kwargs: see :class:`RayPool`.
        load_kwargs: :func:`locos_tl.load_model` arguments for the workers.

    Raises:
        ModelLoadError: a local model directory that does not exist (checked here only
            for a local cluster; remote workers report their own load errors).
        DistributedError: see :func:`worker_model_source`.
    """
    path, kwargs = worker_model_source(model, load_kwargs)
    if ray_address is None and path.startswith((".", "/", "~")):
        from locos_tl.errors import ModelLoadError

        if not Path(path).expanduser().exists():  # local workers: fail before starting Ray
            raise ModelLoadError(f"model directory {path!r} does not exist")
    loader = ModelLoader(path, tuple(sorted(kwargs.items())))
    return RayPool(loader, workers=workers, ray_address=ray_address, **pool_kwargs)


@dataclass(frozen=True)
class ScoreSpec:
    """The per-run settings of a scoring task (hashable: the worker caches its detectors
    and answer directions under it)."""

    methods: tuple[str, ...]
    variant: str
    max_new_tokens: int
    gate_threshold: float
    prefill_mode: str = "auto"
    chunk_size: int | None = None
    stop_rule: str = "newline_token"
    thinking: bool = True
    spans: tuple[tuple[str, str], ...] = ()  # per-method span overrides
    decode_engine: str = "auto"


@dataclass(frozen=True)
class ScoreTask:
    """One trial to score on a :class:`ModelHost`: returns its record (see
    :func:`locos_tl.runner.run_trial`)."""

    spec: ScoreSpec
    trial: Any

    def __call__(self, host: ModelHost) -> dict[str, Any]:
        from locos_tl.detectors import get_detector
        from locos_tl.runner import run_trial
        from locos_tl.unembed import AnswerDirections

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
                         max_new_tokens=s.max_new_tokens, gate_threshold=s.gate_threshold,
                         prefill_mode=s.prefill_mode, chunk_size=s.chunk_size,
                         stop_rule=s.stop_rule, thinking=s.thinking,  # type: ignore[arg-type]
                         decode_engine=s.decode_engine)


@dataclass(frozen=True)
class EnginePathsTask:
    """Which prefill and decode paths a worker's model takes
    (:func:`locos_tl.engine.engine_paths`), for ``meta["engine"]``."""

    prefill_mode: str = "auto"
    decode_engine: str = "auto"

    def __call__(self, host: ModelHost) -> dict[str, Any]:
        from locos_tl.engine import engine_paths

        return engine_paths(host.model, self.prefill_mode, self.decode_engine)


def worker_model_source(
    model: Any, load_kwargs: dict[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    """What each worker loads: ``(name_or_path, load_kwargs)`` for ``model``.

    Args:
        model: a hub name / local path, or a loaded TransformerBridge (its recorded
            name or path is used, and its dtype unless ``load_kwargs`` sets one).
        load_kwargs: :func:`locos_tl.load_model` arguments for the workers.

    Raises:
        DistributedError: a bridge whose checkpoint name/path is not recorded, or whose
            recorded local path no longer exists.
    """
    kwargs = dict(load_kwargs or {})
    if isinstance(model, str | os.PathLike):
        return str(model), kwargs
    from locos_tl.models import model_name

    name = model_name(model)
    looks_local = name.startswith((".", "/", "~")) or name.count("/") > 1
    if name == "unknown" or (looks_local and not Path(name).expanduser().exists()):
        raise DistributedError(
            f"workers load the model themselves, but this bridge's checkpoint path is "
            f"unknown or gone ({name!r}); pass the model's hub name or local directory "
            "instead of the loaded model"
        )
    if "dtype" not in kwargs:
        try:
            kwargs["dtype"] = next(model.parameters()).dtype
        except (StopIteration, AttributeError, TypeError):
            pass
    return name, kwargs



@contextlib.contextmanager
def _model_pool_for(model: Any, pool: RayPool | None, **kwargs: Any) -> Iterator[RayPool]:
    """Yield ``pool`` (it must hold a model), or start a :func:`model_pool` of ``model``
    for the block and close it afterwards.

    Raises:
        DistributedError: ``pool`` is not a model pool.
    """
    if pool is not None:
        if not isinstance(pool.factory, ModelLoader):
            raise DistributedError("pool must be a model_pool(...) (its workers hold a model)")
        yield pool
        return
    own = model_pool(model, **kwargs)
    own.start()
    try:
        yield own
    finally:
        own.close()

def score_trials_distributed(
    model_name_or_path: Any,
    trials: Sequence[Any],
    *,
    workers: int = 2,
    ray_address: str | None = None,
    load_kwargs: dict[str, Any] | None = None,
    method: str = "locos",
    methods: Sequence[str] | None = None,
    variant: str = "raw",
    max_new_tokens: int = 50,
    out_dir: str | Path | None = None,
    seed: int = 0,
    gate_threshold: float | None = None,
    progress: bool = True,
    prefill_mode: str = "auto",
    chunk_size: int | None = None,
    stop_rule: str = "newline_token",
    thinking: bool = True,
    spans: dict[str, str] | None = None,
    pool: RayPool | None = None,
    on_record: Callable[[ResultEvent], None] | None = None,
    decode_engine: str = "auto",
    **pool_kwargs: Any,
) -> Any:
    """:func:`locos_tl.score.score_trials` on ``workers`` Ray actors; identical results.

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
        method, methods, variant, max_new_tokens, out_dir, seed, gate_threshold,
            progress, prefill_mode, chunk_size, stop_rule, thinking, spans,
            decode_engine: as in :func:`~locos_tl.score.score_trials`.
        pool: an open :func:`model_pool` to run on (left open); default: a pool for
            this call.
        on_record: driver-side callback per finished trial (progress, tests).
        **pool_kwargs: :class:`RayPool` options (``num_gpus_per_worker``,
            ``num_cpus_per_worker``, ``max_restarts``, ``max_attempts``,
            ``ray_init_kwargs``).

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
    from locos_tl.answers import GATE_THRESHOLD
    from locos_tl.detectors import get_detector
    from locos_tl.records import RecordStore
    from locos_tl.runner import (
        RESUME_KEYS,
        aggregate,
        check_spans,
        check_trials_fit,
        finished_record,
        method_spans,
        run_settings,
        write_acceptance,
    )
    from locos_tl.unembed import check_variant

    names = list(methods) if methods is not None else [method]
    if not names:
        raise ValueError("no method given")
    spans = check_spans(spans, names)
    detectors = [get_detector(m, span=spans.get(m)) for m in names]  # type: ignore[arg-type]
    used_spans = method_spans(detectors)  # unknown method or span: fail before Ray
    variant = check_variant(variant)
    gate = GATE_THRESHOLD if gate_threshold is None else gate_threshold
    trials = list(trials)
    from locos_tl.stops import check_stop_rule

    spec = ScoreSpec(methods=tuple(names), variant=variant, max_new_tokens=max_new_tokens,
                     gate_threshold=gate, prefill_mode=prefill_mode, chunk_size=chunk_size,
                     stop_rule=check_stop_rule(stop_rule), thinking=thinking,
                     spans=tuple(sorted(spans.items())), decode_engine=decode_engine)
    with _model_pool_for(model_name_or_path, pool, workers=workers, ray_address=ray_address,
                         load_kwargs=load_kwargs, **pool_kwargs) as pool:
        info = pool.info()
        shape = SimpleNamespace(cfg=SimpleNamespace(
            n_layers=info["n_layers"], n_heads=info["n_heads"], n_ctx=info["n_ctx"],
            d_vocab=info["d_vocab"],
        ))
        check_trials_fit(shape, trials, max_new_tokens)
        # the same settings as score_trials: run directories interchange
        settings = run_settings(info["model_name"], info["provenance"]["model"]["dtype"],
                                variant=variant, methods=names,
                                max_new_tokens=max_new_tokens, gate_threshold=gate,
                                seed=seed, trials=trials, stop_rule=spec.stop_rule,
                                thinking=thinking, spans=used_spans)
        store = RecordStore(out_dir, settings, RESUME_KEYS) if out_dir is not None else None
        meta = {**info["provenance"], "settings": settings}
        meta["engine"] = pool.map([EnginePathsTask(prefill_mode, decode_engine)])[0]
        if store is not None:
            store.write_meta(meta)
            from locos_tl.rundir import prune_stale_methods

            prune_stale_methods(out_dir, names)
        records: list[dict[str, Any] | None] = []
        todo: list[int] = []
        for i, trial in enumerate(trials):
            rec = finished_record(store, trial, names, used_spans)
            records.append(rec)
            if rec is None:
                todo.append(i)

        def write(ev: ResultEvent) -> None:
            if store is not None:
                store.append(ev.result)
            if on_record is not None:
                on_record(ev)

        done = pool.map([ScoreTask(spec, trials[i]) for i in todo], on_result=write,
                        progress=progress, desc=f"scoring trials ({pool.n_workers} workers)")
        for i, rec in zip(todo, done, strict=True):
            records[i] = rec
        retried = sorted({trials[todo[j]].trial_id for j in pool.stats.retried})
        meta["distributed"] = {"workers": pool.n_workers, "ray_address": pool.ray_address,
                               "retried_trials": retried,
                               "dead_workers": len(pool.stats.dead_workers)}
    write_acceptance(store, meta, records, names)  # type: ignore[arg-type]
    return aggregate(records, names, model=shape, variant=variant, meta=meta, seed=seed,
                     as_dict=methods is not None)


# -- ablation sweeps ------------------------------------------------------------------


@dataclass(frozen=True)
class AblatedGenerationTask:
    """One greedy generation of ``trial`` with ``heads`` ablated (``mode``), run on a
    :class:`ModelHost`; returns ``{"response", "generated", "stopped_by"}``.

    The ablation acts at every position: the prompt is prefilled on the SDPA twin with
    the same hooks as module hooks, or through the bridge (see
    :func:`locos_tl.ablation.ablate`, :mod:`locos_tl.interventions`).
    """

    heads: tuple[tuple[int, int], ...]
    mode: str
    means: Any
    trial: Any
    max_new_tokens: int
    stop_at_newline: bool = True
    chunk_size: int = 1024
    stop_rule: str = "newline_token"
    thinking: bool = True

    def __call__(self, host: ModelHost) -> dict[str, Any]:
        from locos_tl.ablation import ablate
        from locos_tl.decode import greedy_decode

        with ablate(host.model, list(self.heads), self.mode, means=self.means):  # type: ignore[arg-type]
            res = greedy_decode(host.model, self.trial.tokens,
                                max_new_tokens=self.max_new_tokens,
                                stop_at_newline=self.stop_at_newline, prefill_mode="auto",
                                chunk_size=self.chunk_size,
                                stop_rule=self.stop_rule,  # type: ignore[arg-type]
                                thinking=self.thinking)
        return {"response": res.text, "generated": res.generated, "stopped_by": res.stopped_by}


def generate_ablated_distributed(
    model: Any,
    items: Sequence[tuple[Sequence[tuple[int, int]], Any]],
    *,
    mode: str,
    means: Any = None,
    max_new_tokens: int = 100,
    stop_at_newline: bool = True,
    chunk_size: int = 1024,
    stop_rule: str = "newline_token",
    thinking: bool = True,
    workers: int = 2,
    ray_address: str | None = None,
    load_kwargs: dict[str, Any] | None = None,
    pool: RayPool | None = None,
    on_result: Callable[[ResultEvent], None] | None = None,
    progress: bool = True,
    **pool_kwargs: Any,
) -> list[dict[str, Any]]:
    """Greedy generations under head ablation, ``(heads, trial)`` items spread over Ray
    workers (the engine of ``evaluate(..., workers=N)`` / ``locos ablate --workers N``).

    Args:
        model: hub name, local directory, or a loaded bridge (its path and dtype are
            used); ignored when ``pool`` is given.
        items: ``(heads, trial)`` pairs: the ``(layer, head)`` list to ablate (empty: no
            ablation) and the :class:`~locos_tl.trials.Trial` to generate for.
        mode, means: see :func:`locos_tl.ablation.ablate`.
        max_new_tokens, stop_at_newline, chunk_size, stop_rule, thinking: see
            :func:`locos_tl.decode.greedy_decode`.
        workers, ray_address, load_kwargs, pool, **pool_kwargs: as in
            :func:`score_trials_distributed`.
        on_result: driver-side callback as each generation arrives (write the
            resumable record there); ``ev.index`` indexes ``items``.
        progress: show a tqdm bar.

    Returns:
        One ``{"response", "generated", "stopped_by"}`` dict per item, in order.

    Raises:
        DistributedError: Ray missing, every worker died, or an item keeps crashing
            workers.
    """
    require_ray()
    tasks = [AblatedGenerationTask(tuple((int(a), int(b)) for a, b in heads), mode, means,
                                   trial, max_new_tokens, stop_at_newline, chunk_size,
                                   stop_rule, thinking)
             for heads, trial in items]
    with _model_pool_for(model, pool, workers=workers, ray_address=ray_address,
                         load_kwargs=load_kwargs, **pool_kwargs) as pool:
        return pool.map(tasks, on_result=on_result, progress=progress,
                        desc=f"ablation ({mode}, {pool.n_workers} workers)")
