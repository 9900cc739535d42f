"""``locos patch``: causal retrieval importance (CRI) by activation patching; writes a
CSV, ``meta.json`` and a plotly HTML figure into ``--out`` and resumes an interrupted run.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated, Any, get_args

import typer

from locos_tl.cli import app
from locos_tl.cli._common import (
    ClickContext,
    check_choice,
    check_dtype,
    check_out_dir,
    check_run_dir,
    fail,
    model_key,
    note_resume,
    read_trials_early,
    resumable,
    trials_after_load,
    write_figure,
)
from locos_tl.cli.ablate import checkpoint_dims
from locos_tl.errors import LocosError


@app.command(short_help="Causal retrieval importance (CRI) by activation patching.")
def patch(
    ctx: ClickContext,
    model: Annotated[str, typer.Option(help="Hub name, local HF model directory, .gguf "
                                            "file or a model from `locos models list`.")],
    trials: Annotated[Path, typer.Option(help="Trials file (JSON lines).", exists=True,
                                         dir_okay=False)],
    out: Annotated[Path, typer.Option(help="Run directory (resumable).")],
    corruption: Annotated[str, typer.Option(help="filler (default) or name_swap.")] = "filler",
    batch_size: Annotated[int | None, typer.Option(
        help="Heads patched per forward (default: 16 on a GPU, 1 on CPU).")] = None,
    chunk_size: Annotated[int, typer.Option(help="Query positions per forward.")] = 1024,
    answer_position: Annotated[str, typer.Option(help="generated or prompt_end.")] = "generated",
    locos: Annotated[Path | None, typer.Option(help="LOCOS run directory to compare with "
                                                    "(default: scored here).", exists=True,
                                               file_okay=False)] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Greedy budget.", min=1)] = 50,
    reuse_prefix: Annotated[bool, typer.Option(
        help="Run each patched forward from the patched head's layer on the corrupted "
             "run's residual stream (same CRI; --no-reuse-prefix runs every layer).")] = True,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, ... (default: auto).")] = None,
    dtype: Annotated[str, typer.Option(help="float32, bfloat16, float16.")] = "float32",
) -> None:
    """Causal retrieval importance (CRI) of every head by activation patching."""
    from locos_tl.experiments.compare import compare_rankings
    from locos_tl.experiments.patching import CORRUPTIONS, RESUME_KEYS, AnswerPosition, patch_heads
    from locos_tl.experiments.score import score_trials
    from locos_tl.models.load import load_model, model_settings
    from locos_tl.plot import rank_scatter
    from locos_tl.runs.rundir import load_head_scores

    # every option and input file is checked before the model loads
    check_choice(corruption, CORRUPTIONS, "--corruption")
    check_choice(answer_position, get_args(AnswerPosition), "--answer-position")
    check_dtype(dtype)
    check_out_dir(out)
    try:
        ref = load_head_scores(locos) if locos is not None else None  # fail before patching

        def check_shape(shape: tuple[int, int] | None) -> None:
            if ref is not None and shape is not None and (ref.n_layers, ref.n_heads) != shape:
                raise ValueError(f"--locos {locos} holds scores for {ref.n_layers} layers x "
                                 f"{ref.n_heads} heads; the model has {shape[0]} x {shape[1]}")

        check_shape(checkpoint_dims(model))
        early = read_trials_early(trials, model)
        settings: dict[str, Any] = {"model": model_key(model), "corruption": corruption,
                                    "answer_position": answer_position,
                                    "max_new_tokens": max_new_tokens}
        if early is not None:
            check_run_dir(out, early, settings, RESUME_KEYS)  # before the load
        bridge = load_model(model, device=device, dtype=dtype)
        check_shape((int(bridge.cfg.n_layers), int(bridge.cfg.n_heads)))
        trial_list = trials_after_load(trials, bridge, early)
        check_run_dir(out, trial_list, {**settings, **model_settings(bridge)}, RESUME_KEYS)
        with resumable(out, ctx):
            cri = patch_heads(bridge, trial_list, corruption=corruption,  # type: ignore[arg-type]
                              batch_size=batch_size, chunk_size=chunk_size,
                              answer_position=answer_position,  # type: ignore[arg-type]
                              max_new_tokens=max_new_tokens, out_dir=out,
                              reuse_prefix=reuse_prefix,
                              on_resume=partial(note_resume, out))  # its own reuse count
            cri.check_rankable()  # no usable trial: say so instead of ranking NaNs
            if ref is None:
                ref = score_trials(bridge, trial_list, method="locos", out_dir=out / "locos",
                                   max_new_tokens=max_new_tokens)
                ref.save(out / "locos")
    except (LocosError, ValueError, FileNotFoundError) as exc:
        fail(exc)
    cri.save(out)
    table = compare_rankings(cri, ref)
    table.to_csv(out / "comparison.csv", index=False)
    write_figure(rank_scatter(ref, cri, names=(ref.method, "cri")), out / "cri_vs_locos.html")
    typer.echo(f"\nCRI (logits), top 10 heads of {cri.n_trials} accepted trials:")
    typer.echo(cri.to_frame().head(10)[["label", "score", "ci_low", "ci_high"]].to_string(
        index=False, float_format=lambda x: f"{x:.4f}"))
    typer.echo("\n" + table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    typer.echo(f"\nwrote {out}/ (scores.csv, heads.json, head_scores.json, comparison.csv, "
               "meta.json, trials.jsonl, cri_vs_locos.html)")
