"""Exceptions raised by locos_tl. All derive from :class:`LocosError`."""


class LocosError(Exception):
    """Base class of every error locos_tl raises on bad input."""


class TrialError(LocosError, ValueError):
    """A trial is malformed: needle not found or not token-aligned, empty answer,
    prompt longer than the model's context."""


class ModelLoadError(LocosError, ValueError):
    """A model could not be loaded: unknown name, missing directory, or an
    architecture TransformerLens cannot bridge."""


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
