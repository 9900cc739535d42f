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
        if hs.n_trials == 0:
            typer.secho(f"\nwarning: {method}: no trial was accepted (0 of "
                        f"{hs.meta.get('n_trials', 0)} passed the ROUGE-1 gate or had an "
                        "answer step): every score is NaN", err=True, fg=typer.colors.YELLOW)
            continue
        df = hs.to_frame().head(k)[["label", "score", "ci_low", "ci_high", "n_trials"]]
        typer.echo(f"\n{method}: top {k} heads ({hs.meta.get('n_accepted', hs.n_trials)} of "
                   f"{hs.meta.get('n_trials', hs.n_trials)} trials accepted)")
        typer.echo(df.to_string(index=False, float_format=lambda x: f"{x:.4f}"))


def _parse_device_map(text: str | None) -> str | dict[str, Any] | None:
    """``--device-map``: a strategy name (``auto``, ``balanced``, ...) or a JSON object."""
    if text is None or not text.strip().startswith("{"):
        return text
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--device-map is not valid JSON: {exc}") from exc


def _tokenizer(model: str) -> Any:
    """The model's tokenizer alone (distributed runs load the model in the workers)."""
    from transformers import AutoTokenizer

    from locos_tl.errors import ModelLoadError

    try:
        return AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"could not load the tokenizer of {model!r}: {exc}") from exc


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
    workers: Annotated[int, typer.Option(help="Ray workers (actors), one GPU each when "
                                              "there are GPUs; > 1 needs "
                                              "pip install \"locos_tl\\[ray]\".")] = 1,
    ray_address: Annotated[str | None, typer.Option(help="Running Ray cluster (auto, "
                                                         "host:6379, ray://host:10001); "
                                                         "default: a local cluster for "
                                                         "the run.")] = None,
    device_map: Annotated[str | None, typer.Option(help="Placement over several GPUs: "
                                                        "auto, balanced, sequential, or a "
                                                        "JSON module->device map.")] = None,
    gpus_per_worker: Annotated[float | None, typer.Option(help="GPUs per Ray worker "
                                                               "(default 1 when there are "
                                                               "GPUs; 2 for a model split "
                                                               "over 2 GPUs).")] = None,
) -> None:
    """Score every attention head with LOCOS (arXiv 2607.01002) over retrieval trials."""
    from locos_tl.models import load_model
    from locos_tl.score import score_trials
    from locos_tl.trials import load_trials

    try:
        methods = [m.strip() for m in method.split(",") if m.strip()]
        placement = _parse_device_map(device_map)
        if workers > 1 or ray_address is not None:
            # the workers load the model; the driver only needs the tokenizer
            from locos_tl.distributed import require_ray

            require_ray()
            load_kwargs: dict[str, Any] = {"dtype": dtype}
            if device is not None:
                load_kwargs["device"] = device
            if placement is not None:
                load_kwargs["device_map"] = placement
            extra = {} if gpus_per_worker is None else {"num_gpus_per_worker": gpus_per_worker}
            trial_list = load_trials(trials, _tokenizer(model))
            result: Any = score_trials(model, trial_list, methods=methods, variant=variant,
                                       max_new_tokens=max_new_tokens, out_dir=out,
                                       workers=workers, ray_address=ray_address,
                                       load_kwargs=load_kwargs, **extra)
        else:
            bridge = load_model(model, device=device, dtype=dtype, device_map=placement)
            trial_list = load_trials(trials, bridge.tokenizer,
                                     n_ctx=getattr(bridge.cfg, "n_ctx", None))
            result = score_trials(bridge, trial_list, methods=methods, variant=variant,
                                  max_new_tokens=max_new_tokens, out_dir=out)
    except (LocosError, ValueError) as exc:
        _fail(exc)
    write_outputs(result, out)
    print_top(result, top)
    if isinstance(result, dict) and len(result) > 1:
        typer.echo(f"\nwrote {out}/ (trials.jsonl, meta.json, scores.csv of all methods; "
                   f"per method {', '.join(f'{m}/' for m in result)}: scores.csv, "
                   "heads.json, heatmap.html)")
    else:
        typer.echo(f"\nwrote {out}/ (scores.csv, heads.json, trials.jsonl, meta.json, "
                   "heatmap.html)")
