"""``locos ablate-tf``: the grid of ``locos ablate``, scored teacher forced (no decoding).

Each (head set, trial) gets the answer's log-probability and, on trials with distractor
needles, the name margin (nats), from one prompt forward that starts at the head set's
lowest ablated layer (:mod:`locos_tl.experiments.teacher_forced`). Writes
``evaluation.csv``, ``meta.json``, ``trials.jsonl`` and ``ablation.html`` into ``--out``,
and resumes an interrupted run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from locos_tl.cli import app
from locos_tl.cli._common import (
    ClickContext,
    check_choice,
    check_dtype,
    check_out_dir,
    fail,
    note_resume,
    read_trials_early,
    resumable,
    trials_after_load,
    write_figure,
)
from locos_tl.cli.ablate import (
    check_head_sets,
    checkpoint_dims,
    load_head_sets,
    load_means,
    parse_ints,
)
from locos_tl.errors import LocosError


@app.command("ablate-tf", short_help="Ablate each ranking's top-k heads; score the answer's "
             "log-probability and name margin teacher forced, with no decoding.")
def ablate_teacher_forced(
    ctx: ClickContext,
    model: Annotated[str, typer.Option(help="Hub name, local HF model directory, .gguf "
                                            "file or zoo name.")],
    heads: Annotated[list[str], typer.Option(help="Head-score directory (`locos score` "
                                                  "output), NAME=DIR, or NAME=L14H3,20-1; "
                                                  "repeat for several rankings.")],
    trials: Annotated[Path, typer.Option(help="Trials file (JSON lines).", exists=True,
                                         dir_okay=False)],
    out: Annotated[Path, typer.Option(help="Run directory (resumable).")],
    means: Annotated[Path | None, typer.Option(
        help="Means from `locos calibrate` (needed by the *_mean modes).",
        exists=True, dir_okay=False)] = None,
    k: Annotated[str | None, typer.Option(
        help="Comma-separated k (default: 1,5,10,20,50,100 up to the model's heads).")] = None,
    mode: Annotated[str, typer.Option(help="query_mean (paper), query_zero, output_mean, "
                                           "output_zero.")] = "query_mean",
    seeds: Annotated[str, typer.Option(help="Random-heads seeds.")] = "0,1,2",
    random: Annotated[bool, typer.Option(help="Random-heads control.")] = True,
    bottom: Annotated[str, typer.Option(help="Bottom-k control source: auto, none or a "
                                             "head-score name.")] = "auto",
    reuse_prefix: Annotated[bool, typer.Option(
        help="Compute each ablated prompt from its lowest ablated layer (the same numbers "
             "as recomputing it all, which --no-reuse-prefix does).")] = True,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, ... (default: auto).")] = None,
    dtype: Annotated[str, typer.Option(help="float32, bfloat16, float16.")] = "float32",
) -> None:
    """Ablate each ranking's top-k heads and score the answer teacher forced: its
    log-probability (nats) and, with distractor needles, the name margin."""
    from locos_tl.engine.ablation import ABLATION_MODES
    from locos_tl.experiments.teacher_forced import teacher_forced_sweep
    from locos_tl.models.load import load_model
    from locos_tl.plot import ablation_curves

    check_choice(mode, ABLATION_MODES, "--mode")
    check_dtype(dtype)
    check_out_dir(out)
    k_values = None if k is None else parse_ints(k, "--k")
    seed_values = parse_ints(seeds, "--seeds")
    try:
        head_sets = load_head_sets(heads)
        check_head_sets(head_sets, k_values, checkpoint_dims(model))
        if mode.endswith("_mean") and means is None:
            raise LocosError(f"--mode {mode} needs --means (from `locos calibrate`)")
        table: Any = load_means(means, model) if means is not None else None
        early = read_trials_early(trials, model)
        bridge = load_model(model, device=device, dtype=dtype)
        trial_list = trials_after_load(trials, bridge, early)
        with resumable(out, ctx):
            df = teacher_forced_sweep(bridge, trial_list, head_sets, k=k_values, mode=mode,
                                      means=table, seeds=seed_values, random=random,
                                      bottom=None if bottom == "none" else bottom,
                                      out_dir=out, reuse_prefix=reuse_prefix,
                                      on_resume=lambda n, _: note_resume(out, n,
                                                                         what="cells"))
    except (LocosError, ValueError, FileNotFoundError) as exc:
        fail(exc)
    df.to_csv(out / "evaluation.csv", index=False)
    write_figure(ablation_curves(df, title=f"Teacher-forced ablation ({mode}), nats"),
                 out / "ablation.html")
    wide = df.pivot_table(index=["method", "k", "seed"], columns="metric", values="value")
    typer.echo("\n" + wide.reset_index().to_string(index=False,
                                                   float_format=lambda x: f"{x:.3f}"))
    typer.echo(f"\nwrote {out}/ (evaluation.csv, meta.json, trials.jsonl, ablation.html, "
               "plotly.min.js)")
