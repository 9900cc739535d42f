"""``locos demo``: the main job on the embedded default, the shipped model organism.

Builds literal (NIAH-like) and non-literal (NoLiMa-like) trials for the organism, on its
synthetic filler and, when book text is available, on real book text; scores every head
with LOCOS and the Wu copy score in one decode pass; writes the outputs of
``locos score`` for each task and prints a ranking table against the organism's causal
ground truth (``ground_truth.json`` next to the checkpoint).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from locos_tl.cli import app
from locos_tl.cli._common import ClickContext
from locos_tl.cli.demo_tables import files_summary, ranking_table

if TYPE_CHECKING:
    pass

ROLES = {"nonliteral_writer": "non-literal writer", "literal_copy": "literal copy",
         "prev_token": "previous-token mover"}
#: Greedy decoding budget of the demo (the organisms' answers are one or two tokens).
MAX_NEW_TOKENS = 8


def _roles(model_dir: Path) -> dict[tuple[int, int], str]:
    path = model_dir / "ground_truth.json"
    if not path.exists():
        return {}
    gt = json.loads(path.read_text())
    return {(int(l), int(h)): label for key, label in ROLES.items()
            for l, h in gt.get(key, [])}


def resolve_organism(model: str | None) -> Path:
    """``None`` -> the default organism (``retrieval-long``); a shipped organism's name ->
    its directory; anything else is taken as a directory."""
    from locos_tl.organisms import DEFAULT_ORGANISM, ORGANISMS

    if model is None:
        return Path(DEFAULT_ORGANISM)
    return Path(ORGANISMS.get(model, model))


def valid_length_warning(model_dir: Path, lengths: tuple[int, ...]) -> str | None:
    """A warning when ``lengths`` exceed the organism's measured valid range (its
    ``ground_truth.json``), else ``None``."""
    path = model_dir / "ground_truth.json"
    if not path.exists():
        return None
    vr = json.loads(path.read_text()).get("valid_range") or {}
    top, low = vr.get("max_valid"), vr.get("min_valid")
    if top is None:
        return None
    measured = vr.get("lengths_ok", []) + vr.get("lengths_failed", [])
    floor = low if low is not None and measured and low > min(measured) else None
    if max(lengths) > top:
        where, at = f"only up to {top} tokens", max(lengths)
    elif floor is not None and min(lengths) < floor:
        where, at = f"from {floor} tokens on", min(lengths)
    else:
        return None
    return (f"warning: {model_dir.name} retrieves reliably {where} (its MODEL_CARD.md); at "
            f"{at} tokens more trials fail and the ranking may not be its ground truth"
            + (". Use the default organism (retrieval-long) for long prompts."
               if model_dir.name != "retrieval-long" else "."))


def run_demo(out: Path, *, model_dir: str | None = None, n_trials: int = 40,
             lengths: tuple[int, ...] = (1024,), book: Path | None = None,
             progress: bool = True) -> dict[str, dict[str, Any]]:
    """Score the organism's literal and non-literal tasks; returns ``{run: {method: HeadScores}}``.

    The organism, the prompt lengths, the trials and the run directories are checked
    before the model loads.

    Args:
        out: output directory.
        model_dir: organism directory or shipped name (default: ``retrieval-long``).
        n_trials: trials per task and filler.
        lengths: prompt lengths in tokens, cycled over the trials.
        book: book text for the real-filler runs.

    Raises:
        ModelLoadError: the organism directory is missing.
        LocosError: a length that does not fit the organism's context; a run directory
            under ``out`` holding a run with other settings or trials.
    """
    from locos_tl.cli._common import check_length, check_out_dir, check_run_dir, model_key
    from locos_tl.errors import ModelLoadError

    model_path = resolve_organism(model_dir)
    if not (model_path / "config.json").is_file():
        raise ModelLoadError(f"no organism at {model_path} (no config.json); shipped: "
                             "retrieval-long, retrieval-2l, retrieval-2l-compiled")
    check_length(str(model_path), lengths, MAX_NEW_TOKENS)  # before any import of torch
    check_out_dir(out)

    import pandas as pd

    from locos_tl.cli.score import write_outputs
    from locos_tl.engine.answers import GATE_THRESHOLD
    from locos_tl.experiments.score import score_methods
    from locos_tl.models.load import load_model
    from locos_tl.organisms import default_book_dir, make_trials
    from locos_tl.runs.runner import RESUME_KEYS
    warn = valid_length_warning(model_path, lengths)
    if warn:
        typer.secho(warn, err=True, fg=typer.colors.YELLOW)
    fillers: dict[str, Any] = {"synthetic": None}
    book_dir = book or default_book_dir()
    if book_dir.exists():
        fillers["book"] = book_dir
    else:
        typer.echo(f"(no book text at {book_dir}: synthetic filler only; pass --book FILE)")
    runs = {f"{task}_{filler}": make_trials(task, n_trials, list(lengths), book=src)
            for filler, src in fillers.items() for task in ("nonliteral", "literal")}
    settings = {"model": model_key(str(model_path)), "dtype": "float32", "variant": "raw",
                "max_new_tokens": MAX_NEW_TOKENS, "gate_threshold": GATE_THRESHOLD,
                "stop_rule": "newline_token", "thinking": True}
    for name, trials in runs.items():  # an earlier demo with other settings: refused now
        check_run_dir(out / name, trials, settings, RESUME_KEYS)
    model = load_model(model_path, device="cpu")
    typer.echo(f"organism {model_path.name}, prompts of {', '.join(map(str, lengths))} tokens, "
               f"{n_trials} trials per task and filler")
    roles = _roles(model_path)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, dict[str, Any]] = {}
    rows = []
    for name, trials in runs.items():
        res = score_methods(model, trials, methods=["locos", "wu"],
                            max_new_tokens=MAX_NEW_TOKENS, out_dir=out / name,
                            progress=progress)
        write_outputs(res, out / name, js_dir=out)  # one plotly.min.js for all runs
        summary[name] = res
        meta = res["locos"].meta
        acc = meta["n_accepted"] / max(meta["n_trials"], 1)
        typer.echo(f"\n== {name}: {meta['n_accepted']}/{meta['n_trials']} trials answered "
                   f"correctly (accuracy {acc:.2f}); top heads by LOCOS vs Wu copy score")
        table = ranking_table(res, roles)
        typer.echo(table.to_string(index=False, na_rep=""))
        for method, hs in res.items():
            if hs.all_zero:
                typer.echo(f"{method}: no head scored (every score is 0 over "
                           f"{hs.n_trials} accepted trials)")
        rows.append(table.assign(run=name))
    pd.concat(rows).to_csv(out / "rankings.csv", index=False)
    return summary


@app.command(short_help="Score the shipped model organism; compare with its truth.")
def demo(
    ctx: ClickContext,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("runs/demo"),
    model: Annotated[str | None, typer.Option(help="Organism directory or shipped name "
                                                   "(retrieval-long, retrieval-2l; default: "
                                                   "retrieval-long), or a real model from "
                                                   "`locos models list` (its own demo: "
                                                   "500 tokens, 8 needles).")] = None,
    length: Annotated[int, typer.Option(help="Prompt length in tokens (valid range: "
                                             "retrieval-long 512-2048, retrieval-2l up to "
                                             "128; at most the organism's context - 7: "
                                             "4089, 1017).", min=16)] = 1024,
    n_trials: Annotated[int, typer.Option(help="Trials per task and filler.", min=1)] = 40,
    book: Annotated[Path | None, typer.Option(help="Book text file or directory used as "
                                                   "real filler (default: the "
                                                   "books shipped with locos_tl).")] = None,
) -> None:
    """Score the shipped model organism's literal and non-literal retrieval heads with
    LOCOS and the Wu copy score, and compare them with its causal ground truth."""
    from locos_tl.cli.demo_real import is_real_model
    from locos_tl.errors import LocosError

    if is_real_model(model):  # a real pretrained LLM (`locos models list`): its own demo
        from locos_tl.cli.demo_real import demo_command

        def given(name: str) -> bool:  # set on the command line, not left at its default
            source = ctx.get_parameter_source(name)
            return source is not None and source.name != "DEFAULT"

        demo_command(out, str(model), book=book, length=length if given("length") else None,
                     n_trials=n_trials if given("n_trials") else None)
        return
    t0 = time.perf_counter()
    try:
        summary = run_demo(out, model_dir=model, n_trials=n_trials, lengths=(length,),
                           book=book)
    except (LocosError, FileNotFoundError) as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        raise typer.Exit(code=2) from exc
    typer.echo(
        f"\nLOCOS finds the non-literal writers (they attend to the landmark and write the "
        f"name) that the Wu copy score, which needs the attended token to be the output, "
        f"cannot see.\n{files_summary(out, list(summary))}\n"
        f"({time.perf_counter() - t0:.0f} s)"
    )
