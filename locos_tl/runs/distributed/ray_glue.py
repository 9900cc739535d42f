"""Ray glue: the optional import and the error of a distributed run.

Ray is an optional dependency (``pip install "locos_tl[ray]"``); nothing here imports
it at module level.
"""

from __future__ import annotations

from typing import Any

from locos_tl.errors import LocosError

RAY_INSTALL_HINT = 'pip install "locos_tl[ray]"'


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


def original_error(exc: Any) -> BaseException:
    """The original exception inside a ``RayTaskError`` (with its message), or ``exc``."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc
