"""``locos reproduce``: the paper's protocol on a real model, one resumable command
(:mod:`locos_tl.experiments.protocol`)."""

from __future__ import annotations

import typer

from locos_tl.cli import app
from locos_tl.cli._common import ClickContext


@app.command(
    "reproduce",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                      "help_option_names": []},
    add_help_option=False,
    short_help="The paper's protocol on a real model: detection, ablation grid, controls, "
               "CRI, compression, report (resumable).",
)
def reproduce(ctx: ClickContext) -> None:
    """Run the paper's protocol: trials, detect, calibrate, ablate, patch, compress,
    report (``--stages``). `locos reproduce --help` lists every option
    (``--model``, ``--preset cpu|full``, ``--out``, ``--resume-from``, ``--workers``)."""
    from locos_tl.experiments.protocol.main import main

    raise typer.Exit(main(list(ctx.args)))
