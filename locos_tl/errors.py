"""Exceptions raised by locos_tl (all derive from :class:`LocosError`), and
:func:`warn_caller`, which attributes the package's warnings to the caller's line.

A fixed ``stacklevel`` names the wrong line as soon as a public function reaches a
warning through another one (``score_trials`` -> ``score_methods`` -> the warning) or a
runtime type checker wraps the package's functions (jaxtyping's import hook, as the
test suite runs it). Python's default filters show a ``DeprecationWarning`` only when it
is attributed to ``__main__``, so a warning one frame too deep is never seen.
:func:`warn_caller` counts the frames itself (what Python 3.12's ``skip_file_prefixes``
does, for 3.11 too).
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from types import FrameType


class LocosError(Exception):
    """Base class of every error locos_tl raises on bad input."""


class TrialError(LocosError, ValueError):
    """A trial is malformed: needle not found or not token-aligned, empty answer,
    prompt longer than the model's context."""

    #: bad trials a message lists before "... and N more"
    MAX_LISTED = 20

    @classmethod
    def of_trials(cls, problems: list[tuple[int, str, str]], n_trials: int,
                  where: str = "") -> TrialError:
        """One error naming every trial a run cannot take (a run refuses them all
        before any work, not one per rerun).

        Args:
            problems: ``(index, trial_id, what is wrong)`` of each bad trial, in input
                order; a leading ``"trial {trial_id}: "`` of the text is dropped (the
                line names the trial by index and id).
            n_trials: how many trials the run got.
            where: the refusing function's name, for the message.
        """
        lines = []
        for i, tid, what in problems[: cls.MAX_LISTED]:
            head = f"trial {tid}: "
            what = what[len(head):] if what.startswith(head) else what
            lines.append(f"trial {i} ({tid}): {what}")
        more = len(problems) - len(lines)
        lines += [f"... and {more} more"] if more > 0 else []
        lead = f"{where}: " if where else ""
        if len(problems) == 1:
            return cls(lead + lines[0])
        return cls(f"{lead}{len(problems)} of {n_trials} trials cannot run:\n  "
                   + "\n  ".join(lines))


class ModelLoadError(LocosError, ValueError):
    """A model could not be loaded: unknown name, missing directory, or an
    architecture TransformerLens cannot bridge."""


class CachePermissionError(ModelLoadError):
    """A file of the model cache (``$LOCOS_CACHE``) belongs to another user and this one
    may not read it (or write its lock file). The entry is not damaged: the message names
    the file, its owner and how to share it."""


class DataFormatError(LocosError, ValueError):
    """An input data file (needle set, probe file, haystack) is malformed."""


class NonFiniteError(TrialError):
    """A forward pass produced non-finite numbers (NaN or inf logits or phi), e.g. after
    an fp16 overflow: the trial cannot be scored."""


class NoAcceptedTrialError(LocosError, ValueError):
    """A score set has no accepted trial (every head score is NaN): it cannot be ranked."""


class HeadSpecError(LocosError, ValueError):
    """An argument naming attention heads (or a head count ``k``) is malformed or outside
    the model; see :mod:`locos_tl.head_spec` for the accepted forms."""


class ConfigError(LocosError, ValueError):
    """A run's configuration is refused: an unknown stage, preset or method, a count
    below its minimum, options that contradict each other (the message names the
    option as the command line spells it)."""


# -- warnings at the caller's line ----------------------------------------------------

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
# runtime type-checking wrappers that sit between a package function and its caller
_WRAPPERS = (f"{os.sep}jaxtyping{os.sep}", f"{os.sep}beartype{os.sep}")
# contextlib's __enter__/__exit__ between a @contextmanager of locos_tl and the `with`
_CONTEXTLIB = os.path.abspath(contextlib.__file__)


def _internal(filename: str) -> bool:
    """A frame of locos_tl, of a type-checking wrapper around one of its functions, or of
    contextlib running one of its context managers."""
    if any(w in filename for w in _WRAPPERS):
        return True
    if filename.startswith("<"):
        return filename.startswith("<@beartype")
    path = os.path.abspath(filename)
    return path.startswith(_PACKAGE) or path == _CONTEXTLIB


def _import_machinery(frame: FrameType) -> bool:
    """A frame ``warnings`` skips when it counts ``stacklevel`` (importlib's bootstrap,
    say a ``from locos_tl import name`` reaching the module's ``__getattr__``)."""
    name = frame.f_code.co_filename
    return "importlib" in name and "_bootstrap" in name


def warn_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the first frame outside
    locos_tl (the user's call of the public function, or the ``with`` line of one of its
    context managers), past the wrappers around its functions (jaxtyping, beartype,
    contextlib). Every user-facing warning of locos_tl goes through it."""
    frame: FrameType | None = sys._getframe(0)  # this function: level 1 of the count
    level = 1
    while frame is not None and _internal(frame.f_code.co_filename):
        back = frame.f_back
        while back is not None and _import_machinery(back):
            back = back.f_back
        if back is None:  # nothing outside locos_tl: its outermost frame
            break
        frame, level = back, level + 1
    warnings.warn(message, category, stacklevel=level)
