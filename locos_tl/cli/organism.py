"""``locos train-organism``: (re)build the model organism deterministically."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from locos_tl.cli import app


@app.command("train-organism",
             short_help="Train (or compile) the model organism deterministically.")
def train_organism(
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
        typer.secho(f"error: unknown --preset {preset!r}; use retrieval-2l or retrieval-long",
                    err=True, fg=typer.colors.RED)
        raise typer.Exit(2)
    if compiled and preset != "retrieval-2l":
        typer.secho("error: --compiled builds the compiled twin of retrieval-2l only",
                    err=True, fg=typer.colors.RED)
        raise typer.Exit(2)
    if compiled:
        from locos_tl.organisms.compiled import build_compiled_organism

        typer.echo(build_compiled_organism(out, seed=0 if seed is None else seed,
                                           card=not no_card))
        return
    argv = ["--preset", preset]
    if out is not None:
        argv += ["--out", str(out)]
    if seed is not None:
        argv += ["--seed", str(seed)]
    if no_card:
        argv.append("--no-card")
    from locos_tl.organisms.recipes import main

    if steps is not None:
        argv += ["--steps", str(steps)]
    raise typer.Exit(main(argv))
