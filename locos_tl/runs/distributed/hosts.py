"""Model-holding workers: each Ray actor loads the model once and runs tasks on it.

One warm :func:`model_pool` serves scoring, evaluation sweeps and ablations of the same
model: items sent to it are tasks, ``task(host) -> result`` (:class:`ModelHost`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from locos_tl.runs.distributed.pool import RayPool
from locos_tl.runs.distributed.ray_glue import DistributedError


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
        from locos_tl.models.load import load_model

        self.model = load_model(loader.model, **dict(loader.load_kwargs))
        self.cache: dict[Any, Any] = {}

    def info(self) -> dict[str, Any]:
        """Model facts the driver needs without loading the model itself."""
        from locos_tl.runs.provenance import provenance
        from locos_tl.tokenize import model_tokenizer_identity

        cfg = self.model.cfg
        tok = model_tokenizer_identity(self.model)
        return {
            **_identity(self.model),
            "n_layers": int(cfg.n_layers),
            "n_heads": int(cfg.n_heads),
            "n_ctx": getattr(cfg, "n_ctx", None),
            "d_vocab": int(cfg.d_vocab),
            "provenance": provenance(self.model),
            # the trials' tokenizer is checked on the driver, which loads no model
            "tokenizer": None if tok is None else {"fingerprint": tok.fingerprint,
                                                   "name": tok.name},
        }

    def __call__(self, task: Callable[[ModelHost], Any]) -> Any:
        return task(self)


def _identity(model: Any) -> dict[str, Any]:
    """``{"model_name", "model_hashes"}``: what the driver records as the workers' model."""
    from locos_tl.models.load import model_settings

    identity = model_settings(model)
    return {"model_name": identity["model"], "model_hashes": identity.get("model_hashes")}


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
    from locos_tl.models.load import checkpoint_path

    name = checkpoint_path(model)  # what it was loaded from (runs record its identity)
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
def model_pool_for(model: Any, pool: RayPool | None, **kwargs: Any) -> Iterator[RayPool]:
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
