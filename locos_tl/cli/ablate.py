"""``locos calibrate``, ``locos ablate`` and ``locos patch``: the causal evidence.

Each command writes a CSV, a provenance file (``meta.json``) and a plotly HTML figure
into its ``--out`` directory; ``ablate`` and ``patch`` resume an interrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from locos_tl.cli import app
from locos_tl.errors import LocosError


def _fail(exc: Exception) -> None:
    typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code=2)


def parse_ints(text: str, what: str) -> list[int]:
    """``"1,5,10"`` -> ``[1, 5, 10]``.

    Raises:
        typer.BadParameter: a part is not an integer.
    """
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{what} must be comma-separated integers, got {text!r}") from None


def read_prompts(path: Path) -> list[str]:
    """Calibration text: JSON lines with a ``text`` (or ``prompt``) field, or a plain text
    file with one prompt per non-empty line.

    Raises:
        LocosError: the file does not exist or holds no prompt.
    """
    if not path.exists():
        raise LocosError(f"prompt file {path} does not exist")
    prompts = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            d = json.loads(line)
            prompts.append(str(d.get("text") or d.get("prompt") or ""))
        else:
            prompts.append(line)
    prompts = [p for p in prompts if p.strip()]
    if not prompts:
        raise LocosError(f"{path} holds no prompt")
    return prompts


def load_head_sets(dirs: list[str]) -> dict[str, Any]:
    """``--heads`` values (``DIR`` or ``NAME=DIR``) -> ``{name: HeadScores}``.

    The name is the run's method (``head_scores.json``), else the directory name (a
    reference ``heads.json``); repeated names get the directory name appended.
    """
    from locos_tl.heads import HeadScores

    out: dict[str, Any] = {}
    for spec in dirs:
        name, _, d = spec.rpartition("=") if "=" in spec else ("", "", spec)
        path = Path(d)
        hs = HeadScores.load(path)
        if not name:
            name = hs.method if (path / "head_scores.json").exists() else path.name
            if name in out:
                name = f"{name}:{path.name}"
        out[name] = hs
    return out


@app.command()
def calibrate(
    model: Annotated[str, typer.Option(help="Hub name or local HF model directory.")],
    prompts: Annotated[Path, typer.Option(help="Raw text: JSON lines with 'text', or one "
                                               "prompt per line.")],
    out: Annotated[Path, typer.Option(help="Output .safetensors file.")],
    n: Annotated[int, typer.Option(help="Use the first n prompts (paper: 50).")] = 50,
    max_tokens: Annotated[int, typer.Option(help="Tokens kept per prompt.")] = 5000,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, ... (default: auto).")] = None,
    dtype: Annotated[str, typer.Option(help="float32, bfloat16, float16.")] = "float32",
) -> None:
    """Mean query (hook_q) and output (hook_z) of every head, for mean ablation."""
    from locos_tl.ablation import calibrate_means
    from locos_tl.models import load_model

    try:
        bridge = load_model(model, device=device, dtype=dtype)
        means = calibrate_means(bridge, read_prompts(prompts)[:n], max_tokens=max_tokens,
                                progress=True)
    except (LocosError, ValueError) as exc:
        _fail(exc)
    means.save(out)
    typer.echo(f"wrote {out} ({means.n_prompts} prompts, {means.n_tokens} tokens)")


@app.command()
def ablate(
    model: Annotated[str, typer.Option(help="Hub name or local HF model directory.")],
    heads: Annotated[list[str], typer.Option(help="Head-score directory (`locos score` "
                                                  "output or a heads.json dir); NAME=DIR "
                                                  "to name it. Repeatable.")],
    trials: Annotated[Path, typer.Option(help="Trials file (JSON lines).")],
    out: Annotated[Path, typer.Option(help="Run directory (resumable).")],
    k: Annotated[str, typer.Option(help="Comma-separated head counts.")] = "1,5,10,20,50,100",
    mode: Annotated[str, typer.Option(help="query_mean (paper), query_zero, output_mean, "
                                           "output_zero.")] = "query_mean",
    means: Annotated[Path | None, typer.Option(help="Means from `locos calibrate`.")] = None,
    calibration: Annotated[Path | None, typer.Option(
        help="Calibration text to compute means from (else the trials' prompts).")] = None,
    seeds: Annotated[str, typer.Option(help="Random-heads seeds.")] = "0,1,2",
    random: Annotated[bool, typer.Option(help="Random-heads control.")] = True,
    bottom: Annotated[str, typer.Option(help="Bottom-k control source: auto, none or a "
                                             "head-set name.")] = "auto",
    scorer: Annotated[str, typer.Option(help="nolima, musique or babilong.")] = "nolima",
    max_new_tokens: Annotated[int, typer.Option(help="Greedy decoding budget.")] = 100,
    stop_at_newline: Annotated[bool, typer.Option(help="Stop at a newline.")] = True,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, ... (default: auto).")] = None,
    dtype: Annotated[str, typer.Option(help="float32, bfloat16, float16.")] = "float32",
    workers: Annotated[int, typer.Option(help="Ray workers for the generations, one GPU "
                                              "each when there are GPUs; > 1 needs "
                                              "pip install \"locos_tl\\[ray]\".")] = 1,
    ray_address: Annotated[str | None, typer.Option(help="Running Ray cluster; default: a "
                                                         "local cluster for the run.")] = None,
) -> None:
    """Ablate each ranking's top-k heads and score the answers (docs/concepts.md)."""
    from locos_tl.ablation import AblationMeans, calibrate_means
    from locos_tl.evaluate import evaluate, summarize
    from locos_tl.models import load_model
    from locos_tl.plot import ablation_curves
    from locos_tl.trials import load_trials

    try:
        if workers > 1 or ray_address is not None:
            from locos_tl.distributed import require_ray

            require_ray()  # fail before loading anything
        bridge = load_model(model, device=device, dtype=dtype)
        trial_list = load_trials(trials, bridge.tokenizer,
                                 n_ctx=getattr(bridge.cfg, "n_ctx", None))
        head_sets = load_head_sets(heads)
        mean_table = None
        if mode.endswith("_mean"):
            if means is not None:
                mean_table = AblationMeans.load(means)
            else:
                if calibration is not None:
                    texts: list[Any] = read_prompts(calibration)[:50]
                else:
                    typer.secho("no --means/--calibration: calibrating on the trials' "
                                "prompts", fg=typer.colors.YELLOW, err=True)
                    texts = [list(t.tokens) for t in trial_list[:50]]
                mean_table = calibrate_means(bridge, texts, progress=True)
                out.mkdir(parents=True, exist_ok=True)
                mean_table.save(out / "means.safetensors")
        df = evaluate(bridge, trial_list, head_sets, k=parse_ints(k, "--k"), mode=mode,
                      means=mean_table, seeds=parse_ints(seeds, "--seeds"), random=random,
                      bottom=None if bottom == "none" else bottom, scorer=scorer,
                      out_dir=out, max_new_tokens=max_new_tokens,
                      stop_at_newline=stop_at_newline, workers=workers,
                      ray_address=ray_address)
    except (LocosError, ValueError, FileNotFoundError) as exc:
        _fail(exc)
    ablation_curves(df, title=f"Ablation ({mode}) of the top-k heads").write_html(
        out / "ablation.html", include_plotlyjs=True)
    typer.echo("\n" + summarize(df).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    typer.echo(f"\nwrote {out}/ (evaluation.csv, meta.json, trials.jsonl, ablation.html)")


@app.command()
def patch(
    model: Annotated[str, typer.Option(help="Hub name or local HF model directory.")],
    trials: Annotated[Path, typer.Option(help="Trials file (JSON lines).")],
    out: Annotated[Path, typer.Option(help="Run directory (resumable).")],
    corruption: Annotated[str, typer.Option(help="filler (default) or name_swap.")] = "filler",
    batch_size: Annotated[int | None, typer.Option(
        help="Heads patched per forward (default: 16 on a GPU, 1 on CPU).")] = None,
    chunk_size: Annotated[int, typer.Option(help="Query positions per forward.")] = 1024,
    answer_position: Annotated[str, typer.Option(help="generated or prompt_end.")] = "generated",
    locos: Annotated[Path | None, typer.Option(help="LOCOS run directory to compare with "
                                                    "(default: scored here).")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Greedy budget.")] = 50,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, ... (default: auto).")] = None,
    dtype: Annotated[str, typer.Option(help="float32, bfloat16, float16.")] = "float32",
) -> None:
    """Causal retrieval importance (CRI) of every head by activation patching."""
    from locos_tl.compare import compare_rankings
    from locos_tl.heads import HeadScores
    from locos_tl.models import load_model
    from locos_tl.patching import patch_heads
    from locos_tl.plot import rank_scatter
    from locos_tl.score import score_trials
    from locos_tl.trials import load_trials

    try:
        ref = HeadScores.load(locos) if locos is not None else None  # fail before patching
        bridge = load_model(model, device=device, dtype=dtype)
        shape = (int(bridge.cfg.n_layers), int(bridge.cfg.n_heads))
        if ref is not None and (ref.n_layers, ref.n_heads) != shape:
            raise ValueError(f"--locos {locos} holds scores for {ref.n_layers} layers x "
                             f"{ref.n_heads} heads; the model has {shape[0]} x {shape[1]}")
        trial_list = load_trials(trials, bridge.tokenizer,
                                 n_ctx=getattr(bridge.cfg, "n_ctx", None))
        cri = patch_heads(bridge, trial_list, corruption=corruption,  # type: ignore[arg-type]
                          batch_size=batch_size, chunk_size=chunk_size,
                          answer_position=answer_position,  # type: ignore[arg-type]
                          max_new_tokens=max_new_tokens, out_dir=out)
        if ref is None:
            ref = score_trials(bridge, trial_list, method="locos", out_dir=out / "locos",
                               max_new_tokens=max_new_tokens)
            ref.save(out / "locos")
    except (LocosError, ValueError, FileNotFoundError) as exc:
        _fail(exc)
    cri.save(out)
    table = compare_rankings(cri, ref)
    table.to_csv(out / "comparison.csv", index=False)
    rank_scatter(ref, cri, names=(ref.method, "cri")).write_html(out / "cri_vs_locos.html",
                                                                 include_plotlyjs=True)
    typer.echo(f"\nCRI (logits), top 10 heads of {cri.n_trials} accepted trials:")
    typer.echo(cri.to_frame().head(10)[["label", "score", "ci_low", "ci_high"]].to_string(
        index=False, float_format=lambda x: f"{x:.4f}"))
    typer.echo("\n" + table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    typer.echo(f"\nwrote {out}/ (scores.csv, heads.json, head_scores.json, comparison.csv, "
               "meta.json, trials.jsonl, cri_vs_locos.html)")
