"""Helpers shared by the ``locos`` commands: option checks that run before any model is
loaded, Ctrl-C handling with a resume hint, resume notes, and HTML figures that share one
``plotly.min.js``.

Only typer and the standard library are imported here at module level (the
command line must start without torch, TransformerLens or plotly).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import typer

PLOTLY_JS = "plotly.min.js"

# The click context class typer passes to a command's ``ctx`` parameter (typer >= 0.24
# vendors click; `typer.Context` is a subclass used for annotations, not what it passes,
# and the runtime type checks of the tests see the difference).
ClickContext = typer.Context.__bases__[0]


def fail(exc: Exception | str) -> NoReturn:
    """Print ``error: ...`` in red on stderr and exit with code 2."""
    typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code=2)


def check_choice(value: str, allowed: Iterable[str], option: str) -> str:
    """``value`` if it is one of ``allowed``.

    Raises:
        typer.BadParameter: naming ``option`` and the accepted values (exit code 2).
    """
    allowed = list(allowed)
    if value not in allowed:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(allowed)}",
                                 param_hint=f"'{option}'")
    return value


def check_methods(text: str, option: str = "--method") -> list[str]:
    """Comma-separated detector names (``"locos,wu"``), each a registered detector.

    Raises:
        typer.BadParameter: no name, or an unknown one (the message lists the known ones).
    """
    from locos_tl.detectors import DETECTORS

    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise typer.BadParameter("no method given", param_hint=f"'{option}'")
    for m in names:
        check_choice(m, sorted(DETECTORS), option)
    return names


def check_dtype(dtype: str) -> str:
    """``dtype`` if :func:`locos_tl.models.load_model` accepts it.

    Raises:
        typer.BadParameter: an unknown dtype name.
    """
    from locos_tl.errors import ModelLoadError
    from locos_tl.models import resolve_dtype

    try:
        resolve_dtype(dtype)
    except ModelLoadError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--dtype'") from None
    return dtype


def resume_command(ctx: ClickContext) -> str:
    """The command line that reruns the command of ``ctx`` (its click context) with the
    same options.

    Rebuilt from the parsed parameters (options left at their default are omitted), so
    it is exact however the command was started.
    """
    words = ["locos", *ctx.command_path.split()[1:]]
    for param in ctx.command.params:
        if getattr(param, "param_type_name", "") != "option" or param.name is None:
            continue
        source = ctx.get_parameter_source(param.name)
        if source is None or source.name == "DEFAULT":
            continue
        value = ctx.params.get(param.name)
        if param.is_flag and param.secondary_opts:
            words.append(param.opts[0] if value else param.secondary_opts[0])
        elif param.is_flag:
            if value:
                words.append(param.opts[0])
        elif value is not None:
            for v in (value if param.multiple else [value]):
                words += [param.opts[0], str(v)]
    return shlex.join(words)


@contextmanager
def resumable(out: Path, ctx: ClickContext) -> Iterator[None]:
    """Turn Ctrl-C into a message with the command that resumes the run (``ctx``: the
    command's click context), and exit with code 130."""
    try:
        yield
    except KeyboardInterrupt:
        typer.secho(f"\ninterrupted: the finished trials are saved in {out}/. To resume, run "
                    f"the same command again:\n  {resume_command(ctx)}",
                    err=True, fg=typer.colors.YELLOW)
        raise typer.Exit(code=130) from None


def note_resume(out: Path, n_done: int, n_total: int | None = None,
                what: str = "trials") -> None:
    """Say on stderr how many finished ``what`` a resumed run skips (nothing when none)."""
    if n_done:
        of = f" of {n_total}" if n_total is not None else ""
        typer.secho(f"resuming {out}: skipping {n_done}{of} finished {what}",
                    err=True, fg=typer.colors.CYAN)


def finished_trials(out: Path, trials: Sequence[Any], methods: Sequence[str]) -> int:
    """How many of ``trials`` ``locos score`` will reuse from the run directory ``out``
    instead of running them (:func:`locos_tl.score.finished_record`'s rule)."""
    if not (Path(out) / "trials.jsonl").exists():
        return 0
    from locos_tl.records import RecordStore
    from locos_tl.score import finished_record

    store = RecordStore(out, {}, ())  # read only: no settings check, nothing appended
    return sum(finished_record(store, t, list(methods)) is not None for t in trials)


def write_figure(fig: Any, path: Path, js_dir: Path | None = None) -> Path:
    """Write a plotly figure as HTML that loads ``plotly.min.js`` from a file, offline.

    The bundle is written once into ``js_dir`` (default: the figure's folder) and every
    figure references it by a relative path, instead of each file embedding 4.8 MB.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    js_dir = path.parent if js_dir is None else Path(js_dir)
    if js_dir.resolve() == path.parent.resolve():
        fig.write_html(path, include_plotlyjs="directory")  # plotly writes the bundle
        return path
    bundle = js_dir / PLOTLY_JS
    if not bundle.exists():
        from plotly.offline import get_plotlyjs

        js_dir.mkdir(parents=True, exist_ok=True)
        bundle.write_text(get_plotlyjs(), encoding="utf-8")
    rel = Path(os.path.relpath(bundle, path.parent)).as_posix()
    fig.write_html(path, include_plotlyjs=rel)
    return path
