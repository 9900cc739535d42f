"""The model organism: a small trained Qwen3 checkpoint with planted retrieval heads."""

from __future__ import annotations

from locos_tl.models.shipped import SHIPPED_DIR as _SHIPPED
from locos_tl.organisms.controls import echo_examples, make_echo_trials
from locos_tl.organisms.tasks import (
    TASKS,
    BookFiller,
    ContextSpec,
    default_book_dir,
    make_example,
    make_trials,
)

#: The default organism's name: the one `locos demo`, the quick start and the notebooks use.
ORGANISM_NAME = "retrieval-long"

#: The long-context organism (3 layers x 8 heads; retrieves at 512-2048 tokens; see its
#: MODEL_CARD.md).
LONG_ORGANISM: str = str(_SHIPPED / "retrieval-long")

#: The default organism's directory (``organisms_data/<ORGANISM_NAME>`` of the package):
#: :data:`LONG_ORGANISM`.
DEFAULT_ORGANISM: str = LONG_ORGANISM

#: The 2-layer organism ``retrieval-long`` was grown from (2 x 8 heads, prompts up to 128
#: tokens): fast, for tests and short prompts.
SMALL_ORGANISM: str = str(_SHIPPED / "retrieval-2l")

#: A hand-compiled twin of :data:`SMALL_ORGANISM` (weights set by hand; exact ground truth
#: by construction).
COMPILED_ORGANISM: str = str(_SHIPPED / "retrieval-2l-compiled")

#: Shipped organisms by name.
ORGANISMS: dict[str, str] = {
    "retrieval-long": LONG_ORGANISM,
    "retrieval-2l": SMALL_ORGANISM,
    "retrieval-2l-compiled": COMPILED_ORGANISM,
}


def organism_path(name: str) -> str:
    """Directory of a shipped organism.

    Raises:
        KeyError: unknown name (the message lists the shipped ones).
    """
    try:
        return ORGANISMS[name]
    except KeyError:
        raise KeyError(f"unknown organism {name!r}; shipped: {sorted(ORGANISMS)}") from None


__all__ = [
    "COMPILED_ORGANISM",
    "DEFAULT_ORGANISM",
    "LONG_ORGANISM",
    "ORGANISMS",
    "ORGANISM_NAME",
    "SMALL_ORGANISM",
    "TASKS",
    "BookFiller",
    "ContextSpec",
    "default_book_dir",
    "echo_examples",
    "make_example",
    "make_echo_trials",
    "make_trials",
    "organism_path",
]
