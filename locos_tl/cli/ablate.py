"""``locos calibrate`` and ``locos ablate``: mean ablation, the causal evidence
(``locos patch``: :mod:`locos_tl.cli.patch`).

Each command writes a CSV, a provenance file (``meta.json``) and a plotly HTML figure
into its ``--out`` directory; ``ablate`` resumes an interrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from locos_tl.cli import app
from locos_tl.cli._common import (
    ClickContext,
    check_choice,
    check_dtype,
    check_out_dir,
    check_out_file,
    check_run_dir,
    checkpoint_d_head,
    fail,
    model_key,
    note_resume,
    read_trials_early,
    resumable,
    trials_after_load,
    write_figure,
)
from locos_tl.errors import LocosError
from locos_tl.experiments.options import ABLATION_DECODE


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
        LocosError: the file does not exist, holds a broken JSON line (named by line) or
            no prompt.
    """
    if not path.exists():
        raise LocosError(f"prompt file {path} does not exist")
    prompts = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                d = json.loads(line)
            except ValueError as exc:
                raise LocosError(f"{path}:{i}: not valid JSON ({exc})") from None
            prompts.append(str(d.get("text") or d.get("prompt") or ""))
        else:
            prompts.append(line)
    prompts = [p for p in prompts if p.strip()]
    if not prompts:
        raise LocosError(f"{path} holds no prompt")
    return prompts


def load_head_sets(dirs: list[str]) -> dict[str, Any]:
    """``--heads`` values -> ``{name: HeadScores or ranked head list}``.

    A value is ``DIR`` or ``NAME=DIR`` (a run directory), or ``NAME=HEADS``: a ranked,
    comma-separated head list such as ``L14H3,20-1`` (parsed by
    :func:`locos_tl.head_spec.parse_head_list`; used when no such directory exists). The
    name of a directory is the run's method (``head_scores.json``), else the directory
    name (a reference ``heads.json``); repeated names get the directory name appended.

    Raises:
        LocosError: neither an existing directory nor a well-formed head list.
        FileNotFoundError: a directory without head scores.
    """
    from locos_tl.head_spec import HeadSpecError, parse_head_list
    from locos_tl.runs.rundir import load_head_scores

    out: dict[str, Any] = {}
    for spec in dirs:
        name, _, d = spec.rpartition("=") if "=" in spec else ("", "", spec)
        path = Path(d)
        if not path.exists() and "/" not in d and "\\" not in d:
            try:
                out[name or d] = parse_head_list(d, what=f"--heads {spec!r}")
            except HeadSpecError as exc:
                raise LocosError(f"--heads {spec!r} is no directory and no head list: {exc}; "
                                 "give a score directory, NAME=DIR, or NAME=L14H3,20-1") from None
            continue
        hs = load_head_scores(path)  # a run (one method or several), a method folder, ...
        if not name:
            reference = (path / "heads.json").exists() and not (path / "head_scores.json").exists()
            name = path.name if reference else hs.method
            if name in out:
                name = f"{name}:{path.name}"
        out[name] = hs
    return out


def checkpoint_dims(model: str) -> tuple[int, int] | None:
    """``(n_layers, n_heads)`` of a local checkpoint, read from its ``config.json``
    (HF names ``num_hidden_layers`` / ``num_attention_heads``, also under
    ``text_config``) without loading the model; None for a hub name or no such keys."""
    path = Path(model) / "config.json"
    if not path.is_file():
        from locos_tl.models.zoo import REAL_MODELS  # a known real model: its registry geometry

        entry = REAL_MODELS.get(model)
        return (entry.n_layers, entry.n_heads) if entry is not None else None
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    for c in (cfg, cfg.get("text_config") or {}):
        n_layers, n_heads = c.get("num_hidden_layers"), c.get("num_attention_heads")
        if isinstance(n_layers, int) and isinstance(n_heads, int):
            return n_layers, n_heads
    return None


def check_head_sets(head_sets: dict[str, Any], k: list[int] | None,
                    dims: tuple[int, int] | None) -> None:
    """Refuse, before the model loads, a ranking that is no result (no accepted trial,
    or every score 0: its top-k would be index order), and, when the checkpoint's
    ``dims`` are known, heads or ``--k`` values outside the model.

    Raises:
        LocosError: one of those, naming the head set and the way out.
    """
    from locos_tl.head_spec import parse_heads, parse_ks

    for name, hs in head_sets.items():
        if hasattr(hs, "scores"):
            if hs.n_trials == 0:
                raise LocosError(f"head set {name!r} has no accepted trial: its ranking is "
                                 "all NaN")
            if hs.all_zero:
                raise LocosError(
                    f"head set {name!r}: every {hs.method} score is 0, so its top-k would "
                    "be the heads' index order (L0H0, L0H1, ...), not a ranking; check that "
                    f"run, or give the heads to ablate explicitly as --heads {name}=L0H0,...")
            if dims is not None and (hs.n_layers, hs.n_heads) != dims:
                raise LocosError(f"head set {name!r} scores {hs.n_layers} layers x "
                                 f"{hs.n_heads} heads; the model has {dims[0]} x {dims[1]}")
        elif dims is not None:
            parse_heads(hs, n_layers=dims[0], n_heads=dims[1], what=f"--heads {name}")
    if k is not None and dims is not None:
        parse_ks(k, n_total=dims[0] * dims[1], what="--k")


def check_resume(out: Path, trials: list[Any], settings: dict[str, Any],
                 extend: bool = False) -> dict[str, Any] | None:
    """The settings recorded in the run directory ``out`` (None: no run there yet),
    after refusing a run over another trial set or with other ``settings`` (every key
    compared; None: not known yet), before anything is written
    (:func:`locos_tl.cli._common.check_run_dir`). ``extend`` (``--extend``): a run over
    a subset of ``trials`` is accepted and grows.

    Raises:
        LocosError: ``out`` holds a run over another trial set (with ``extend``: over a
            trial not in ``trials``) or with other settings.
    """
    return check_run_dir(out, trials, settings, list(settings),
                         extend_field="trial" if extend else None)


def load_means(path: Path, model: str) -> Any:
    """``--means``: the calibration means, checked against the checkpoint's
    ``config.json`` (layers, heads, head width) before the model loads.

    Raises:
        LocosError: not a means file (names the option and the file), or means of
            another shape than the model's.
    """
    from locos_tl.engine.ablation import AblationMeans

    try:
        table = AblationMeans.load(path)
    except LocosError as exc:
        raise LocosError(f"--means {exc}") from None
    dims, d_head = checkpoint_dims(model), checkpoint_d_head(model)
    if dims is not None:
        want = (*dims, d_head) if d_head is not None else dims
        for name, t in (("q", table.q), ("z", table.z)):
            if t.ndim != 3 or tuple(t.shape)[:len(want)] != want:
                raise LocosError(
                    f"--means {path}: {name} has shape {tuple(t.shape)} (layers, heads, "
                    f"head width), the model {model} {want}: means of another model; "
                    "calibrate this one with `locos calibrate`")
    return table


def check_means_hash(out: Path, old: dict[str, Any] | None, table: Any) -> None:
    """Refuse calibration means other than those the run in ``out`` was made with.

    Raises:
        LocosError: naming both hashes and the way out.
    """
    from locos_tl.experiments.ablation_plan import means_hash

    if table is not None and old is not None \
            and old.get("means_hash") not in (None, means_hash(table)):
        raise LocosError(f"{out} holds a run made with other calibration means "
                         f"(means hash {old['means_hash']}, not {means_hash(table)}); "
                         "use a new --out directory, or the run's means.safetensors")


@app.command(short_help="Mean query and output of every head, for mean ablation.")
def calibrate(
    model: Annotated[str, typer.Option(help="Hub name, local HF model directory, .gguf "
                                            "file or a model from `locos models list`.")],
    prompts: Annotated[Path, typer.Option(help="Raw text: JSON lines with 'text', or one "
                                               "prompt per line.", exists=True,
                                          dir_okay=False)],
    out: Annotated[Path, typer.Option(help="Output .safetensors file.")],
    n: Annotated[int, typer.Option(help="Use the first n prompts (paper: 50).", min=1)] = 50,
    max_tokens: Annotated[int, typer.Option(help="Tokens kept per prompt.", min=1)] = 5000,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, ... (default: auto).")] = None,
    dtype: Annotated[str, typer.Option(help="float32, bfloat16, float16.")] = "float32",
) -> None:
    """Mean query (hook_q) and output (hook_z) of every head, for mean ablation."""
    from locos_tl.engine.ablation import calibrate_means
    from locos_tl.models.load import load_model

    check_dtype(dtype)
    check_out_file(out)
    try:
        texts = read_prompts(prompts)[:n]  # before the model loads
        bridge = load_model(model, device=device, dtype=dtype)
        means = calibrate_means(bridge, texts, max_tokens=max_tokens, progress=True)
    except (LocosError, ValueError) as exc:
        fail(exc)
    means.save(out)
    typer.echo(f"wrote {out} ({means.n_prompts} prompts, {means.n_tokens} tokens)")


@app.command(short_help="Ablate each ranking's top-k heads; score the answers.")
def ablate(
    ctx: ClickContext,
    model: Annotated[str, typer.Option(help="Hub name, local HF model directory, .gguf "
                                            "file or a model from `locos models list`.")],
    heads: Annotated[list[str], typer.Option(help="Head-score directory (`locos score` "
                                                  "output or a heads.json dir); NAME=DIR "
                                                  "to name it, or NAME=L14H3,20-1 for a "
                                                  "ranked head list. Repeatable.")],
    trials: Annotated[Path, typer.Option(help="Trials file (JSON lines).", exists=True,
                                         dir_okay=False)],
    out: Annotated[Path, typer.Option(help="Run directory (resumable).")],
    k: Annotated[str | None, typer.Option(
        help="Comma-separated head counts, each 1..n_layers*n_heads (default: "
             "1,5,10,20,50,100 up to the model's head count).")] = None,
    mode: Annotated[str, typer.Option(help="query_mean (paper), query_zero, output_mean, "
                                           "output_zero.")] = "query_mean",
    means: Annotated[Path | None, typer.Option(help="Means from `locos calibrate`.",
                                               exists=True, dir_okay=False)] = None,
    calibration: Annotated[Path | None, typer.Option(
        help="Calibration text to compute means from (else the trials' prompts).",
        exists=True, dir_okay=False)] = None,
    seeds: Annotated[str, typer.Option(help="Random-heads seeds.")] = "0,1,2",
    random: Annotated[bool, typer.Option(help="Random-heads control.")] = True,
    bottom: Annotated[str, typer.Option(help="Bottom-k control source: auto, none or a "
                                             "head-set name.")] = "auto",
    scorer: Annotated[str, typer.Option(help="nolima, musique or babilong.")] = "nolima",
    max_new_tokens: Annotated[int, typer.Option(
        help="Greedy decoding budget, in tokens (100, the authors' release's ablation "
             "budget, where scoring decodes 50).", min=1)] = ABLATION_DECODE.max_new_tokens,
    stop_rule: Annotated[str, typer.Option(help="newline_token (paper's release: only the "
                                                "bare newline token stops), "
                                                "contains_newline, or none (no newline "
                                                "stops).")] = ABLATION_DECODE.stop_rule,
    thinking: Annotated[bool, typer.Option(help="Skip a <think>...</think> block before "
                                                "the stop rule and the metric.")] = True,
    reuse_prefix: Annotated[bool, typer.Option(
        help="Compute each ablated prompt, and each step that follows the unablated "
             "decoding, from the lowest ablated layer (same tokens; --no-reuse-prefix "
             "recomputes it all).")] = True,
    control: Annotated[Path | None, typer.Option(
        help="Specificity-control trials (`locos build-trials parametric|arithmetic|"
             "organism-echo`): run the same ablations on them and write DS(k) "
             "(dissociation.csv, meta.json).", exists=True, dir_okay=False)] = None,
    control_metric: Annotated[str, typer.Option(
        help="Control metric P: exact_match (paper's release: lower-cased, stripped) or "
             "contains (NoLiMa's case-sensitive substring).")] = "exact_match",
    retrieval_metric: Annotated[str | None, typer.Option(
        help="Retrieval metric R of DS(k) (default: rougeL for nolima, em for musique, "
             "substring for babilong).")] = None,
    control_max_new_tokens: Annotated[int | None, typer.Option(
        help="Decoding budget of the control trials (default: --max-new-tokens; 1 for "
             "the organism's echo control).", min=1)] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, ... (default: auto).")] = None,
    dtype: Annotated[str, typer.Option(help="float32, bfloat16, float16.")] = "float32",
    workers: Annotated[int, typer.Option(help="Ray workers for the generations, one GPU "
                                              "each when there are GPUs; > 1 needs "
                                              "pip install \"locos_tl[ray]\".", min=1)] = 1,
    ray_address: Annotated[str | None, typer.Option(help="Running Ray cluster; default: a "
                                                         "local cluster for the run.")] = None,
    extend: Annotated[bool, typer.Option(
        "--extend", help="Grow a run: --out may hold a run over a subset of these trials "
                         "(and --control's); its generations are kept, only the new "
                         "trials run.")] = False,
) -> None:
    """Ablate each ranking's top-k heads and score the answers (docs/concepts.md)."""
    import pandas as pd

    from locos_tl.engine.ablation import ABLATION_MODES, AblationMeans, calibrate_means
    from locos_tl.engine.stops import STOP_RULES
    from locos_tl.experiments.ablation_plan import means_hash
    from locos_tl.experiments.dissociation import summarize
    from locos_tl.experiments.evaluate import ablation_sweep
    from locos_tl.experiments.task_metrics import CONTROL_METRICS, RETRIEVAL_METRICS, SCORERS
    from locos_tl.models.load import load_model, model_settings
    from locos_tl.plot import ablation_curves

    # every option and input file is checked before the model loads
    check_choice(mode, ABLATION_MODES, "--mode")
    check_choice(stop_rule, STOP_RULES, "--stop-rule")
    check_choice(scorer, sorted(SCORERS), "--scorer")
    check_choice(control_metric, list(CONTROL_METRICS), "--control-metric")
    r_metric = retrieval_metric or RETRIEVAL_METRICS.get(scorer, "rougeL")
    check_dtype(dtype)
    check_out_dir(out)
    k_values = None if k is None else parse_ints(k, "--k")
    seed_values = parse_ints(seeds, "--seeds")
    try:
        executor: Any = workers
        if workers > 1 or ray_address is not None:
            from locos_tl.runs.distributed import RayWorkers, require_ray

            require_ray()  # fail before loading anything
            executor = RayWorkers(workers, address=ray_address)
        head_sets = load_head_sets(heads)
        check_head_sets(head_sets, k_values, checkpoint_dims(model))  # before the load
        if bottom not in ("auto", "none"):  # a head-score entry, not a head list
            check_choice(bottom, ["auto", "none", *(n for n, v in head_sets.items()
                                                    if hasattr(v, "scores"))], "--bottom")
        mean_table = None
        if mode.endswith("_mean") and means is not None:
            mean_table = load_means(means, model)
        calib_texts = read_prompts(calibration)[:50] if calibration is not None else None
        if control is not None:
            check_out_dir(out / "control", "--out (its control/ folder)")
        early = read_trials_early(trials, model)
        early_control = None if control is None else read_trials_early(control, model)
        run_settings: dict[str, Any] = {
            "model": model_key(model), "mode": mode, "max_new_tokens": max_new_tokens,
            "stop_at_newline": stop_rule != "none", "stop_rule": stop_rule,
            "thinking": thinking}

        def check_run(trial_list: list[Any], control_list: list[Any] | None) -> Any:
            """Refuse a run directory over other trials or settings before anything in
            it is touched (means.safetensors included); returns its old settings."""
            nonlocal control_max_new_tokens
            if control_list is not None and control_max_new_tokens is None:
                echo = all((t.meta or {}).get("control") == "echo" for t in control_list)
                control_max_new_tokens = 1 if echo else max_new_tokens
            old = check_resume(out, trial_list, run_settings, extend)
            if control_list is not None:
                check_resume(out / "control", control_list,
                             dict(run_settings, max_new_tokens=control_max_new_tokens),
                             extend)
            check_means_hash(out, old, mean_table)
            return old

        if early is not None and (control is None or early_control is not None):
            check_run(early, early_control)  # before the load
        bridge = load_model(model, device=device, dtype=dtype)
        trial_list = trials_after_load(trials, bridge, early)
        control_list = None if control is None else trials_after_load(control, bridge,
                                                                      early_control)
        run_settings.update(model_settings(bridge))  # name and content hashes
        old = check_run(trial_list, control_list)
        with resumable(out, ctx):
            if mode.endswith("_mean") and mean_table is None:
                stored = out / "means.safetensors"
                own = (AblationMeans.load(stored) if old is not None and calib_texts is None
                       and stored.exists() else None)
                if own is not None and means_hash(own) == old.get("means_hash"):
                    mean_table = own  # the resumed run's own means
                    typer.secho(f"reusing {stored} (the run's calibration means)",
                                err=True, fg=typer.colors.CYAN)
                else:
                    if calib_texts is not None:
                        texts: list[Any] = list(calib_texts)
                    else:
                        typer.secho("no --means/--calibration: calibrating on the trials' "
                                    "prompts", fg=typer.colors.YELLOW, err=True)
                        texts = [list(t.tokens) for t in trial_list[:50]]
                    mean_table = calibrate_means(bridge, texts, progress=True)
                    if old is not None and old.get("means_hash") not in (
                            None, means_hash(mean_table)):
                        raise LocosError(
                            f"{out} holds a run made with other calibration means (means "
                            f"hash {old['means_hash']}, not {means_hash(mean_table)}); use "
                            "a new --out directory")
                    out.mkdir(parents=True, exist_ok=True)
                    mean_table.save(stored)
            df = ablation_sweep(
                bridge, trial_list, head_sets, k=k_values, mode=mode, means=mean_table,
                seeds=seed_values, random=random,
                bottom=None if bottom == "none" else bottom, scorer=scorer, out_dir=out,
                max_new_tokens=max_new_tokens, stop_rule=stop_rule, thinking=thinking,
                workers=executor, extend=extend,
                reuse_prefix=reuse_prefix,  # its own reuse count:
                on_resume=lambda n, _: note_resume(out, n, what="generations"))
            # the directory's table ablation_sweep wrote (jobs.json): earlier calls' k and seeds
            df = pd.read_csv(out / "evaluation.csv")
            ds = None
            if control_list is not None:
                df_control = ablation_sweep(
                    bridge, control_list, head_sets, k=k_values, mode=mode, means=mean_table,
                    seeds=seed_values, random=random,
                    bottom=None if bottom == "none" else bottom, scorer="control",
                    out_dir=out / "control",
                    max_new_tokens=control_max_new_tokens,
                    stop_rule=stop_rule, thinking=thinking,
                    workers=executor, extend=extend, reuse_prefix=reuse_prefix)
                df_control = pd.read_csv(out / "control" / "evaluation.csv")
                ds = write_dissociation(out, df, df_control, control=control,
                                        retrieval_metric=r_metric,
                                        control_metric=control_metric)
                p0 = ds["P0"].iloc[0] if len(ds) else float("nan")
                if not p0 > 0:
                    typer.secho(f"warning: the control's unablated score P0 = {p0} "
                                f"({control_metric}): DS(k) divides by P0, so it is "
                                "undefined (NaN); choose control trials the model answers "
                                "(or another --control-metric)", err=True,
                                fg=typer.colors.YELLOW)
    except (LocosError, ValueError, FileNotFoundError) as exc:
        fail(exc)
    write_figure(ablation_curves(df, title=f"Ablation ({mode}) of the top-k heads"),
                 out / "ablation.html")
    typer.echo("\n" + summarize(df).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    written = "evaluation.csv, jobs.json, meta.json, trials.jsonl, ablation.html"
    if ds is not None:
        from locos_tl.plot import dissociation

        write_figure(dissociation(ds, title=f"DS(k): {r_metric} drop minus control "
                                            f"{control_metric} drop"),
                     out / "dissociation.html")
        typer.echo(f"\nDS(k) = (R0 - R(k))/R0 - (P0 - P(k))/P0  (R: {r_metric}, P: control "
                   f"{control_metric})\n"
                   + ds.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        written += ", control/, dissociation.csv, dissociation.html"
    typer.echo(f"\nwrote {out}/ ({written})")


def write_dissociation(out: Path, df: Any, df_control: Any, *, control: Path,
                       retrieval_metric: str, control_metric: str) -> Any:
    """Write ``dissociation.csv`` and a ``dissociation`` block into ``out/meta.json``.

    ``DS(k) = (R0 - R(k)) / R0 - (P0 - P(k)) / P0`` (arXiv 2607.01002, Sec. 4; see
    :func:`locos_tl.experiments.dissociation.dissociation_score`); the control's own run
    (generations, ``evaluation.csv``, ``meta.json``) is ``out/control/``.

    Returns:
        The DS table (``method, k, R0, R, P0, P, ds``).

    Raises:
        ValueError: a metric missing from the retrieval or control rows.
    """
    from locos_tl.experiments.dissociation import dissociation_score

    ds = dissociation_score(df, df_control, retrieval_metric=retrieval_metric,
                            control_metric=control_metric)
    ds.to_csv(out / "dissociation.csv", index=False)
    meta_path = out / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    meta["dissociation"] = {
        "formula": "DS(k) = (R0 - R(k)) / R0 - (P0 - P(k)) / P0",
        "control_trials": str(control), "control_run": "control/",
        "retrieval_metric": retrieval_metric, "control_metric": control_metric,
        "R0": float(ds["R0"].iloc[0]) if len(ds) else None,
        "P0": float(ds["P0"].iloc[0]) if len(ds) else None,
        "rows": [{"method": r.method, "k": int(r.k), "R": float(r.R), "P": float(r.P),
                  "ds": None if r.ds != r.ds else float(r.ds)} for r in ds.itertuples()],
    }
    meta_path.write_text(json.dumps(meta, indent=2, default=str))
    return ds
