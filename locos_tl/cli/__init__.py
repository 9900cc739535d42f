"""The ``locos`` command line (typer): each sub-module registers its commands on ``app``."""

from __future__ import annotations

import inspect
from typing import Any

import typer
from typer.core import TyperGroup

# `locos --help` lists the commands in the order of the workflow, not of registration
WORKFLOW_ORDER = ("models", "build-trials", "score", "ablate", "ablate-tf", "patch", "compress",
                  "calibrate", "reproduce", "demo", "train-organism", "elicit")


class HelpGroup(TyperGroup):
    """Commands listed in workflow order, each with its whole summary (wrapped, not cut
    at the first period as click does with "et al.")."""

    def list_commands(self, ctx: Any) -> list[str]:
        names = list(self.commands)
        rank = {n: i for i, n in enumerate(WORKFLOW_ORDER)}
        return sorted(names, key=lambda n: (rank.get(n, len(rank)), names.index(n)))

    def format_commands(self, ctx: Any, formatter: Any) -> None:  # click's (or typer's)
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is None or cmd.hidden:
                continue
            text = cmd.short_help or inspect.cleandoc(cmd.help or "").split("\n\n")[0]
            rows.append((name, " ".join(text.split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


app = typer.Typer(
    name="locos",
    cls=HelpGroup,
    help="LOCOS retrieval-head detection on TransformerLens models (arXiv 2607.01002).",
    no_args_is_help=True,
    add_completion=False,
    # plain click help: option names and defaults are wrapped, never cut, at 80 columns
    rich_markup_mode=None,
    pretty_exceptions_show_locals=False,
    context_settings={"max_content_width": 100},
)

# Sub-modules register commands on `app` when imported (one module per command group).
from locos_tl.cli import ablate as _ablate  # noqa: E402,F401
from locos_tl.cli import ablate_teacher_forced as _ablate_teacher_forced  # noqa: E402,F401
from locos_tl.cli import compress as _compress  # noqa: E402,F401
from locos_tl.cli import demo as _demo  # noqa: E402,F401
from locos_tl.cli import elicit as _elicit  # noqa: E402,F401
from locos_tl.cli import models as _models  # noqa: E402,F401
from locos_tl.cli import organism as _organism  # noqa: E402,F401
from locos_tl.cli import patch as _patch  # noqa: E402,F401
from locos_tl.cli import reproduce as _reproduce  # noqa: E402,F401
from locos_tl.cli import score as _score  # noqa: E402,F401
from locos_tl.cli import trials as _trials  # noqa: E402,F401
