"""Silence transformers' and TransformerLens's loading chatter, keeping errors."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Within the block, transformers logs errors only and stdout is swallowed."""
    logger = logging.getLogger("transformers")
    old = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logger.setLevel(old)
