"""``locos train-organism``: (re)build the model organism deterministically."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from locos_tl.cli import app
from locos_tl.cli._common import ClickContext, fail, resume_command
from locos_tl.errors import LocosError


@app.command("train-organism",
             short_help="Train (or compile) the model organism deterministically.")
def train_organism(
    ctx: ClickContext,
    preset: Annotated[str, typer.Option(
        help="which organism: retrieval-2l (2 layers, prompts up to 128 tokens) or "
             "retrieval-long (3 layers, 512-2048 tokens; warm-started from retrieval-2l, "
             "about an hour on one CPU thread, resumable)")] = "retrieval-2l",
    out: Annotated[Path | None, typer.Option(help="output directory (default: shipped)")] = None,
    seed: Annotated[int | None, typer.Option(help="master seed (default: shipped)")] = None,
    steps: Annotated[int | None, typer.Option(help="optimiser steps (default: shipped)")] = None,
    compiled: Annotated[bool, typer.Option(
        "--compiled", help="build the hand-compiled organism instead of training")] = False,
    no_card: Annotated[bool, typer.Option(
        "--no-card", help="skip the causal analysis and MODEL_CARD.md")] = False,
) -> None:
    """Train an organism (Qwen3, GQA) on the literal/non-literal retrieval tasks, save it
    with save_pretrained, establish its ground-truth heads causally and write MODEL_CARD.md.
    Same as `python -m locos_tl.organisms.train` (or `python -m locos_tl.organisms.compiled`
    with --compiled).
    """
    if preset not in ("retrieval-2l", "retrieval-long"):
        fail(f"unknown --preset {preset!r}; use retrieval-2l or retrieval-long")
    if compiled and preset != "retrieval-2l":
        fail("--compiled builds the compiled twin of retrieval-2l only")
    if compiled:
        from locos_tl.organisms.compiled import build_compiled_organism

        typer.echo(build_compiled_organism(out, seed=0 if seed is None else seed,
                                           card=not no_card))
        return
    from locos_tl.organisms.recipes import train_organism

    overrides = {k: v for k, v in (("seed", seed), ("steps", steps)) if v is not None}
    try:  # the configuration is checked before any training
        train_organism(preset, out, card=not no_card, command=resume_command(ctx),
                       log=typer.echo, **overrides)
    except LocosError as exc:
        fail(exc)
