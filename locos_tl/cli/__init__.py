"""The ``locos`` command line (typer). Each sub-module registers its commands on ``app``."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="locos",
    help="LOCOS retrieval-head detection on TransformerLens models (arXiv 2607.01002).",
    no_args_is_help=True,
    add_completion=False,
)

# Sub-modules register commands on `app` when imported (one module per command group).
from locos_tl.cli import ablate as _ablate  # noqa: E402,F401
from locos_tl.cli import demo as _demo  # noqa: E402,F401
from locos_tl.cli import organism as _organism  # noqa: E402,F401
from locos_tl.cli import score as _score  # noqa: E402,F401
from locos_tl.cli import trials as _trials  # noqa: E402,F401
