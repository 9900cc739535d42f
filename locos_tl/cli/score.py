"""``locos score``: score heads over a trials file and write the run directory."""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from locos_tl.cli import app
from locos_tl.cli._common import (
    ClickContext,
    check_choice,
    check_dtype,
    check_methods,
    check_out_dir,
    check_run_dir,
    fail,
    method_help,
    model_key,
    note_resume,
    read_trials_early,
    resumable,
    trials_after_load,
    write_figure,
)
from locos_tl.engine.options import DecodeOptions
from locos_tl.errors import LocosError

if TYPE_CHECKING:
    from locos_tl.heads import HeadScores


def write_outputs(
    result: HeadScores | dict[str, HeadScores], out_dir: str | Path,
    js_dir: str | Path | None = None,
) -> dict[str, Path]:
    """Write ``scores.csv``, ``heads.json``, ``head_scores.json`` and ``heatmap.html``.

    One layout for one method or several (:mod:`locos_tl.runs.rundir`): each method gets
    ``out_dir/<method>/`` and ``out_dir/scores.csv`` holds all of them (tidy); folders
    of methods not in ``result`` are removed.
    ``trials.jsonl`` and ``meta.json`` are written by the scorer itself. The figures load
    one ``plotly.min.js`` written into ``js_dir`` (default: ``out_dir``).
    """
    from locos_tl.plot import head_heatmap
    from locos_tl.runs.rundir import write_method_dirs

    out = Path(out_dir)
    results = result if isinstance(result, dict) else {result.method: result}
    paths = write_method_dirs(results, out)
    for method, hs in results.items():
        d = paths[method]
        write_figure(head_heatmap(hs), d / "heatmap.html", js_dir=js_dir or out)
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
        if hs.all_zero:  # e.g. Wu when no answer token was copied
            typer.echo(f"\n{method}: no head scored (every score is 0 over "
                       f"{hs.n_trials} accepted trials): no ranking to show")
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
    from locos_tl.models.zoo import resolve_checkpoint

    model = str(resolve_checkpoint(model) or model)  # a known real model or a .gguf file
    try:
        return AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"could not load the tokenizer of {model!r}: {exc}") from exc


def kept_methods(out: Path, methods: list[str]) -> list[str]:
    """``methods`` plus the methods the run directory ``out`` already holds (nothing
    is deleted: a rerun with fewer ``--method`` names keeps the others' scores, from the
    same records, and says so)."""
    from locos_tl.runs.rundir import kept_methods as held

    extra = held(out, methods)
    if extra:
        typer.secho(f"{out} also holds {', '.join(extra)} scores (an earlier --method): "
                    "kept, from the same trial records; use a new --out for a run of "
                    f"{', '.join(methods)} alone", err=True, fg=typer.colors.CYAN)
    return methods + extra


def check_accepted(result: HeadScores | dict[str, HeadScores], out: Path) -> None:
    """Refuse a run in which no method accepted a trial: there is nothing to rank.

    Raises:
        LocosError: with the acceptance counts and where the responses are.
    """
    results = result if isinstance(result, dict) else {result.method: result}
    if any(hs.n_trials for hs in results.values()):
        return
    m = next(iter(results.values())).meta
    counts = ", ".join(f"{m.get(f'n_dropped_{k}', 0)} {what}" for k, what in (
        ("gate", "failed the ROUGE-1 gate"), ("no_answer_step", "had no answer step"),
        ("non_finite", "had NaN/inf numbers")))
    raise LocosError(
        f"no trial was accepted: 0 of {m.get('n_trials', '?')} ({counts}), so there is no "
        f"score to rank. The model's responses are in {out}/trials.jsonl: use trials the "
        "model answers, or a larger --max-new-tokens")


def _run_score(model: str, trials: Path, out: Path, options: Any, *, device: str | None,
               dtype: str, workers: int, ray_address: str | None,
               placement: str | dict[str, Any] | None, gpus_per_worker: float | None,
               early: list[Any] | None = None) -> Any:
    """Load the model (or start Ray), the trials (``early``: read before the load), and
    score with ``options`` (:class:`~locos_tl.runs.options.ScoreOptions`); says what a
    resume skips."""
    from locos_tl.errors import TrialError
    from locos_tl.experiments.score import score_methods
    from locos_tl.models.load import load_model
    from locos_tl.trials import load_trials

    if workers > 1 or ray_address is not None:
        # the workers load the model; the driver only needs the tokenizer
        from locos_tl.runs.distributed import RayWorkers, require_ray

        require_ray()
        load_kwargs: dict[str, Any] = {"dtype": dtype}
        if device is not None:
            load_kwargs["device"] = device
        if placement is not None:
            load_kwargs["device_map"] = placement
        ray = RayWorkers(workers, address=ray_address, load_kwargs=load_kwargs,
                         num_gpus_per_worker=gpus_per_worker)
        trial_list = early if early is not None else load_trials(trials, _tokenizer(model))
        if not trial_list:
            raise TrialError(f"{trials} holds no trial")
        return score_methods(model, trial_list, options=options, out_dir=out, workers=ray,
                             on_resume=partial(note_resume, out))
    bridge = load_model(model, device=device, dtype=dtype, device_map=placement)
    trial_list = trials_after_load(trials, bridge, early)
    return score_methods(bridge, trial_list, options=options, out_dir=out,
                         on_resume=partial(note_resume, out))  # the run's own reuse count


@app.command(short_help="Score every attention head: LOCOS and the baselines.")
def score(
    ctx: ClickContext,
    model: Annotated[str, typer.Option(help="Hub name, local HF model directory, .gguf "
                                            "file or a model from `locos models list`.")],
    trials: Annotated[Path, typer.Option(help="JSON lines: prompt, needle, answer (or "
                                              "records written by `locos build-trials`).",
                                         exists=True, dir_okay=False)],
    out: Annotated[Path, typer.Option(help="Run directory (resumable).")],
    variant: Annotated[str, typer.Option(help="raw (paper) or exact (norms frozen).")] = "raw",
    method: Annotated[str, typer.Option(help=method_help())] = "locos",
    max_new_tokens: Annotated[int, typer.Option(help="Greedy decoding budget (tokens).",
                                                min=1)] = DecodeOptions.max_new_tokens,
    stop_rule: Annotated[str, typer.Option(help="newline_token (paper's release: only the "
                                                "bare newline token stops) or "
                                                "contains_newline.")] = "newline_token",
    thinking: Annotated[bool, typer.Option(help="Skip a <think>...</think> block before "
                                                "the stop rule, gate and answer "
                                                "steps.")] = True,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, ... (default: auto).")] = None,
    dtype: Annotated[str, typer.Option(help="float32, bfloat16, float16.")] = "float32",
    top: Annotated[int, typer.Option(help="How many top heads to print.", min=0)] = 10,
    batch_size: Annotated[int, typer.Option(help="Trials decoded together (same records "
                                                 "as 1; faster on a GPU).", min=1)] = 1,
    workers: Annotated[int, typer.Option(help="Ray workers (actors), one GPU each when "
                                              "there are GPUs; > 1 needs "
                                              "pip install \"locos_tl[ray]\".", min=1)] = 1,
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
    import warnings

    from locos_tl.engine.options import STOP_RULES
    from locos_tl.engine.unembed import VARIANTS
    from locos_tl.experiments.methods import method_names
    from locos_tl.models.load import resolve_dtype
    from locos_tl.runs.options import ScoreOptions
    from locos_tl.runs.runner import RESUME_KEYS

    # every option, the trials file and the run directory are checked before the model
    # (or Ray) is loaded
    check_choice(variant, VARIANTS, "--variant")
    check_choice(stop_rule, STOP_RULES, "--stop-rule")
    requested = check_methods(method)
    own = [m for m in requested if m in method_names("own_passes")]
    if own and (workers > 1 or ray_address is not None):
        raise typer.BadParameter(f"{', '.join(own)} run in this process only: use "
                                 "--workers 1 (score them in a run of their own)",
                                 param_hint="'--method'")
    check_dtype(dtype)
    check_out_dir(out)
    try:
        placement = _parse_device_map(device_map)
        early = read_trials_early(trials, model)
        distributed = workers > 1 or ray_address is not None
        options = ScoreOptions.from_kwargs(variant=variant, max_new_tokens=max_new_tokens,
                                           stop_rule=stop_rule, thinking=thinking,
                                           batch_size=batch_size)
        if early is not None:  # the run's settings, as meta.json records them
            check_run_dir(out, early, {
                "model": None if distributed else model_key(model),
                "dtype": str(resolve_dtype(dtype)).replace("torch.", ""),
                **options.settings()}, RESUME_KEYS)
        methods = kept_methods(out, requested)
        with resumable(out, ctx), warnings.catch_warnings():
            # one message below instead of a warning per method and file
            warnings.filterwarnings("ignore", message=".*no accepted trial",
                                    category=RuntimeWarning)
            warnings.filterwarnings("ignore", message=".*no trial was accepted",
                                    category=RuntimeWarning)
            result = _run_score(model, trials, out,
                                dataclasses.replace(options, methods=tuple(methods)),
                                device=device, dtype=dtype, workers=workers,
                                ray_address=ray_address, placement=placement,
                                gpus_per_worker=gpus_per_worker, early=early)
            check_accepted(result, out)
            write_outputs(result, out)
    except (LocosError, ValueError) as exc:
        fail(exc)
    shown = result if not isinstance(result, dict) else {m: result[m] for m in requested}
    print_top(shown, top)
    methods_written = list(result) if isinstance(result, dict) else [result.method]
    typer.echo(f"\nwrote {out}/ (trials.jsonl, meta.json, scores.csv of "
               f"{'all methods' if len(methods_written) > 1 else 'the method'}; per method "
               f"{', '.join(f'{m}/' for m in methods_written)}: scores.csv, heads.json, "
               "head_scores.json, heatmap.html)")
