"""``locos score``: score heads over a trials file and write the run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import typer

from locos_tl.cli import app
from locos_tl.errors import LocosError
from locos_tl.heads import HeadScores


def write_outputs(
    result: HeadScores | dict[str, HeadScores], out_dir: str | Path
) -> dict[str, Path]:
    """Write ``scores.csv``, ``heads.json``, ``head_scores.json`` and ``heatmap.html``.

    With one method the files go straight into ``out_dir``; with several, each method
    gets ``out_dir/<method>/`` and ``out_dir/scores.csv`` holds all of them (tidy).
    ``trials.jsonl`` and ``meta.json`` are written by the scorer itself.
    """
    from locos_tl.plot import head_heatmap

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = result if isinstance(result, dict) else {result.method: result}
    single = len(results) == 1
    paths: dict[str, Path] = {}
    for method, hs in results.items():
        d = out if single else out / method
        hs.save(d)
        head_heatmap(hs).write_html(d / "heatmap.html", include_plotlyjs=True)
        paths[method] = d
    if not single:
        pd.concat([hs.to_frame() for hs in results.values()]).to_csv(out / "scores.csv",
                                                                       index=False)
    return paths


def print_top(result: HeadScores | dict[str, HeadScores], k: int = 10) -> None:
    """Print the top-k heads of each method as a table."""
    results = result if isinstance(result, dict) else {result.method: result}
    for method, hs in results.items():
        df = hs.to_frame().head(k)[["label", "score", "ci_low", "ci_high", "n_trials"]]
        typer.echo(f"\n{method}: top {k} heads ({hs.meta.get('n_accepted', hs.n_trials)} of "
                   f"{hs.meta.get('n_trials', hs.n_trials)} trials accepted)")
        typer.echo(df.to_string(index=False, float_format=lambda x: f"{x:.4f}"))


def _fail(exc: Exception) -> None:
    typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code=2)


@app.command()
def score(
    model: Annotated[str, typer.Option(help="Hub name or local HF model directory.")],
    trials: Annotated[Path, typer.Option(help="JSON lines: prompt, needle, answer (or "
                                              "records written by `locos build-trials`).")],
    out: Annotated[Path, typer.Option(help="Run directory (resumable).")],
    variant: Annotated[str, typer.Option(help="raw (paper) or exact (norms frozen).")] = "raw",
    method: Annotated[str, typer.Option(help="Comma-separated methods: locos, wu, headkv, "
                                             "attention_spatial, dla.")] = "locos",
    max_new_tokens: Annotated[int, typer.Option(help="Greedy decoding budget.")] = 50,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, ... (default: auto).")] = None,
    dtype: Annotated[str, typer.Option(help="float32, bfloat16, float16.")] = "float32",
    top: Annotated[int, typer.Option(help="How many top heads to print.")] = 10,
) -> None:
    """Score every attention head with LOCOS (arXiv 2607.01002) over retrieval trials."""
    from locos_tl.models import load_model
    from locos_tl.score import score_trials
    from locos_tl.trials import load_trials

    try:
        bridge = load_model(model, device=device, dtype=dtype)
        trial_list = load_trials(trials, bridge.tokenizer, n_ctx=getattr(bridge.cfg, "n_ctx", None))
        methods = [m.strip() for m in method.split(",") if m.strip()]
        result: Any = score_trials(bridge, trial_list, methods=methods, variant=variant,
                                   max_new_tokens=max_new_tokens, out_dir=out)
    except (LocosError, ValueError) as exc:
        _fail(exc)
    write_outputs(result, out)
    print_top(result, top)
    typer.echo(f"\nwrote {out}/ (scores.csv, heads.json, trials.jsonl, meta.json, heatmap.html)")
