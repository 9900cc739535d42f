"""``locos compress``: accuracy under head-guided KV-cache compression.

For each head ranking (a ``locos score`` run directory gives one ranking per method it
holds: LOCOS, Wu, HeadKV, ...) and each retained fraction of the KV cache, the trials'
context is prefilled, its cache compressed per unit (full cache for the top-ranked
units, attention sinks plus a recent window for the others), the question run through
the compressed cache, and the answer decoded greedily
(:func:`locos_tl.experiments.compress.compression_sweep`; protocol in ``docs/compression.md``).

Writes ``compression.csv`` (one row per ranking, allocation, fraction and trial,
appended trial by trial, so an interrupted run resumes where it stopped),
``meta.json`` (provenance) and ``compression.html`` (:func:`locos_tl.plot.
compression_curves`), and prints accuracy per ranking x fraction x task.
"""

from __future__ import annotations

import json
import warnings
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
    write_figure,
)
from locos_tl.errors import LocosError

CSV_FILE = "compression.csv"
META_FILE = "meta.json"
FIGURE_FILE = "compression.html"
DEFAULT_FRACTIONS = "0.02,0.05,0.1,0.2,0.5,1.0"
#: Controls swept beside the rankings (budgets that use no head score).
CONTROLS = ("uniform", "random")
#: ``--score``: the answer test the figure plots -> its column of compression.csv
#: (definitions: :mod:`locos_tl.experiments.task_metrics`)
SCORES = {"first-token": "correct", "word-match": "answer_correct"}


def parse_fractions(text: str) -> list[float]:
    """``"0.02,0.1,1"`` -> ``[0.02, 0.1, 1.0]``, each in ``(0, 1]``, without repeats
    (:func:`locos_tl.experiments.compress.fractions.check_fractions`, as the API checks them).

    Raises:
        typer.BadParameter: a part is no number or lies outside ``(0, 1]``, or none given.
    """
    from locos_tl.experiments.compress.fractions import check_fractions

    try:
        return check_fractions(p.strip() for p in text.split(",") if p.strip())
    except LocosError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--fractions'") from None


def parse_controls(text: str) -> list[str]:
    """``"uniform,random"`` -> the controls to sweep (``""`` or ``"none"``: none).

    Raises:
        typer.BadParameter: an unknown control.
    """
    names = [c.strip() for c in text.split(",") if c.strip() and c.strip() != "none"]
    for c in names:
        check_choice(c, CONTROLS, "--include")
    return list(dict.fromkeys(names))


def load_rankings(specs: list[str]) -> dict[str, Any]:
    """``--heads`` values -> ``{name: HeadScores}``, one ranking per method a directory
    holds.

    A value is ``DIR`` or ``NAME=DIR``. A ``locos score`` run directory with several
    methods gives one ranking per method (``locos``, ``wu``, ``headkv``; named
    ``NAME:method`` under ``NAME=``); any other directory
    :func:`locos_tl.runs.rundir.load_head_scores` reads (a method folder, a ``HeadScores.save``
    directory, a reference ``heads.json`` file or its directory) gives one, named by its
    method (or ``NAME``). Repeated names get the directory name appended.

    Raises:
        FileNotFoundError: a directory that does not exist or holds no head scores.
        LocosError: an unfinished run, or a ranking that ranks nothing (no accepted
            trial, or every score 0).
    """
    from locos_tl.runs.rundir import load_head_scores, run_methods

    out: dict[str, Any] = {}
    for spec in specs:
        name, _, d = spec.rpartition("=") if "=" in spec else ("", "", spec)
        path = Path(d)
        methods = run_methods(path)  # None for a file or a non-run directory
        try:
            found = ([(m, load_head_scores(path, m)) for m in methods] if methods
                     else [(None, load_head_scores(path))])
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"--heads {spec!r}: {exc}") from None
        for method, hs in found:
            key = (f"{name}:{method}" if name and len(found) > 1 else name) or hs.method
            if key in out:
                key = f"{key}:{path.name}"
            if hs.n_trials == 0:
                raise LocosError(f"ranking {key!r} ({path}) has no accepted trial: its "
                                 "scores are all NaN")
            if hs.all_zero:
                raise LocosError(f"ranking {key!r} ({path}): every {hs.method} score is 0, "
                                 "so it ranks nothing (its order would be the heads' index "
                                 "order); score other trials or leave it out")
            out[key] = hs
    if not out:
        raise LocosError("no ranking given (--heads)")
    return out


def check_query_starts(paths: list[Path], query_start: int | None) -> None:
    """Refuse, before the model loads, trials that carry no ``meta.query_start`` when
    ``--query-start`` is not given (reads the JSON lines only).

    Raises:
        LocosError: a record without ``meta.query_start`` (names the file and line).
    """
    if query_start is not None:
        return
    for path in paths:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                meta = json.loads(line).get("meta") or {}
            except (ValueError, AttributeError):
                continue  # load_trials names a malformed line
            if "query_start" not in meta:
                raise LocosError(
                    f"{path}:{i}: the trial has no meta.query_start (where its question "
                    "starts; organism trials carry it): pass --query-start N (the first "
                    "question position; negative counts from the prompt's end)")


def with_query_start(trials: list[Any], query_start: int | None) -> list[Any]:
    """The trials without ``meta["query_start"]`` get it from ``--query-start``
    (negative: counted from each prompt's end); the others, or all when it is None, are
    unchanged (as in :func:`locos_tl.experiments.compress.compression_sweep`)."""
    import dataclasses

    if query_start is None:
        return trials
    out = []
    for t in trials:
        if (t.meta or {}).get("query_start") is not None:  # the trial's own wins
            out.append(t)
            continue
        qs = query_start if query_start >= 0 else t.n_tokens + query_start
        out.append(dataclasses.replace(t, meta={**(t.meta or {}), "query_start": int(qs)}))
    return out


def ranking_hash(hs: Any) -> str:
    """:func:`locos_tl.experiments.compress.sweep.ranking_hash` (imported on use: the CLI
    starts without torch)."""
    from locos_tl.experiments.compress.sweep import ranking_hash as digest

    return digest(hs)


def check_compress_resume(out: Path, settings: dict[str, Any], *,
                          partial: bool = False) -> None:
    """Refuse a run directory that holds a run with other settings (model, dtype,
    trials, rankings, fractions, unit, ...), before anything is written.

    Args:
        out: the run directory.
        settings: the run's settings, as ``meta.json`` records them.
        partial: compare only the keys of ``settings`` (the check before the model
            loads, with the settings the options alone give).

    A run recorded before ``dtype`` was a setting is compared on the dtype its
    provenance records (``meta.json["model"]["dtype"]``). The model is compared by
    identity (name and content hashes, :func:`locos_tl.models.identity.same_model`),
    so a run made under another cache root resumes.

    Raises:
        LocosError: naming the settings that differ.
    """
    meta_path = out / META_FILE
    if meta_path.exists() and not (out / CSV_FILE).exists():
        raise LocosError(f"{out} holds another command's run ({META_FILE} without "
                         f"{CSV_FILE}); use a new --out directory")
    if not meta_path.exists():
        return
    try:
        meta = json.loads(meta_path.read_text())
        old = dict(meta.get("settings", {}))
    except (ValueError, AttributeError):
        raise LocosError(f"{meta_path} is not valid JSON; use a new --out") from None
    if "dtype" not in old and isinstance(meta.get("model"), dict):
        old["dtype"] = meta["model"].get("dtype")  # recorded before dtype was a setting
    from locos_tl.models.identity import HASHES_KEY, same_model

    keys = set(settings) if partial else set(old) | set(settings)
    diff = sorted(k for k in keys - {"model", HASHES_KEY} if old.get(k) != settings.get(k))
    if "model" in keys and not same_model(old, settings):  # name and hashes, not a path
        diff.insert(0, "model")
    if diff:
        raise LocosError(f"{out} holds a compression run with other settings "
                         f"({', '.join(diff)}); use a new --out directory")


def done_trials(out: Path) -> set[str]:
    """Trial ids whose rows ``compression.csv`` already holds."""
    import pandas as pd

    path = out / CSV_FILE
    if not path.exists() or path.stat().st_size == 0:
        return set()
    return set(pd.read_csv(path, usecols=["trial"], dtype=str)["trial"])


def summary_table(df: Any) -> Any:
    """Accuracy per ranking (x allocation) x fraction, one column per task and test
    (``first token``: the first response token is a first token of the answer, column
    ``correct``; ``word match``: the answer as a whole word in the response, column
    ``answer_correct``; :mod:`locos_tl.experiments.task_metrics`), plus the mean
    retained share of the cache and of its bytes."""
    cols = ["ranking", "allocation", "fraction"]
    acc = df.pivot_table(index=cols, columns="task", values="correct", aggfunc="mean")
    acc.columns = [f"first token {c}" for c in acc.columns]
    if "answer_correct" in df.columns:
        has = df.assign(answer_correct=df["answer_correct"].astype(float))
        word = has.pivot_table(index=cols, columns="task", values="answer_correct",
                               aggfunc="mean")
        word.columns = [f"word match {c}" for c in word.columns]
        acc = acc.join(word)
    kept = df.groupby(cols).agg(kept=("retained_fraction", "mean"),
                                kv_bytes=("kv_bytes", "sum"),
                                full_kv_bytes=("full_kv_bytes", "sum"))
    kept["bytes kept"] = kept.pop("kv_bytes") / kept.pop("full_kv_bytes")
    order = {r: i for i, r in enumerate(dict.fromkeys(df["ranking"]))}
    table = acc.join(kept).reset_index()
    return table.sort_values(["ranking", "allocation", "fraction"],
                             key=lambda c: c.map(order) if c.name == "ranking" else c)


@app.command(short_help="Accuracy when the KV cache is compressed by head rankings.")
def compress(
    ctx: ClickContext,
    model: Annotated[str, typer.Option(help="Hub name, local HF model directory, .gguf "
                                            "file or a model from `locos models list`.")],
    heads: Annotated[list[str], typer.Option(
        help="Head scores: a `locos score` run directory (one ranking per method it "
             "holds), a method folder, a heads.json file or its dir; NAME=DIR to name it. "
             "Repeatable.")],
    trials: Annotated[list[Path], typer.Option(
        help="Trials file (JSON lines); repeatable. Each trial's question starts at "
             "meta.query_start, else at --query-start.", exists=True, dir_okay=False)],
    out: Annotated[Path, typer.Option(help="Run directory (resumable).")],
    fractions: Annotated[str, typer.Option(
        help="Retained fractions of the KV cache, each in (0, 1].")] = DEFAULT_FRACTIONS,
    unit: Annotated[str, typer.Option(
        help="kv_group (one budget per GQA kv head: real eviction) or query_head (one "
             "per query head: the exact per-head mask).")] = "kv_group",
    include: Annotated[str, typer.Option(
        help="Controls swept beside the rankings: uniform, random (comma-separated), "
             "or none.")] = "uniform,random",
    query_start: Annotated[int | None, typer.Option(
        help="First question position for trials without meta.query_start; negative "
             "counts from the prompt's end (-2: the last two tokens).")] = None,
    allocation: Annotated[str, typer.Option(
        help="How the budget is split over units by a ranking: greedy (top units keep "
             "their whole cache), proportional (HeadKV) or uniform. HeadKV scores always "
             "use proportional, their published allocation.")] = "greedy",
    sinks: Annotated[int, typer.Option(help="First positions every unit keeps "
                                            "(attention sinks).", min=0)] = 4,
    min_recent: Annotated[int, typer.Option(help="Last context positions every unit "
                                                 "keeps.", min=0)] = 8,
    group_reduce: Annotated[str, typer.Option(
        help="kv_group unit: a group's score from its query heads, max or sum.")] = "max",
    seed: Annotated[int, typer.Option(help="Seed of the random control.")] = 0,
    max_new_tokens: Annotated[int, typer.Option(
        help="Greedy decoding budget, in tokens (8, not scoring's 50: the answers are "
             "names, read from the first token and a whole-word match).", min=1)] = 8,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, ... (default: auto).")] = None,
    dtype: Annotated[str, typer.Option(help="float32, bfloat16, float16.")] = "float32",
    score: Annotated[str, typer.Option(
        help="What the figure plots: first-token (the first response token is a first "
             "token of the answer) or word-match (the answer occurs in the response as a "
             "whole word; for models that answer in a sentence). The table prints "
             "both.")] = "first-token",
) -> None:
    """Sweep the retained fraction of the KV cache under each head ranking and score the
    greedy answers (docs/compression.md)."""
    from locos_tl.cli.ablate import checkpoint_dims
    from locos_tl.experiments.compress.budgets import ALLOCATIONS, UNITS

    # every option and input file is checked before the model loads
    check_choice(unit, UNITS, "--unit")
    check_choice(allocation, ALLOCATIONS, "--allocation")
    check_choice(group_reduce, ("max", "sum"), "--group-reduce")
    check_choice(score, SCORES, "--score")
    fraction_list = parse_fractions(fractions)
    controls = parse_controls(include)
    check_dtype(dtype)
    check_out_dir(out)
    from locos_tl.models.load import resolve_dtype

    dtype_name = str(resolve_dtype(dtype)).replace("torch.", "")  # as the model reports it
    if query_start == 0:
        raise typer.BadParameter("0 leaves no context to compress: give the first question "
                                 "position (>= 1), or a negative offset from the end",
                                 param_hint="'--query-start'")
    try:
        rankings = load_rankings(heads)
        dims = checkpoint_dims(model)
        for name, hs in rankings.items():
            if dims is not None and (hs.n_layers, hs.n_heads) != dims:
                raise LocosError(f"ranking {name!r} scores {hs.n_layers} layers x "
                                 f"{hs.n_heads} heads; the model has {dims[0]} x {dims[1]}")
        check_query_starts(trials, query_start)
        options = {
            "dtype": dtype_name, "unit": unit, "fractions": fraction_list,
            "include": controls, "seed": seed, "allocation": allocation, "sinks": sinks,
            "min_recent": min_recent, "group_reduce": group_reduce,
            "max_new_tokens": max_new_tokens, "query_start": query_start,
            "rankings": {name: ranking_hash(hs) for name, hs in rankings.items()},
        }
        check_compress_resume(out, options, partial=True)  # before the model loads
        # the trials files' contents and the run's trial set, before the model loads too
        early = [read_trials_early(p, model) for p in trials]
        if all(e is not None for e in early):
            from locos_tl.trials import trial_set_hash as set_hash

            every = [t for e in early for t in e]
            check_compress_resume(out, {"n_trials": len(every),
                                        "trial_set_hash": set_hash(every)}, partial=True)
        import pandas as pd
        from tqdm.auto import tqdm

        from locos_tl.experiments.compress import compression_sweep
        from locos_tl.experiments.compress.cache import compression_twin
        from locos_tl.models.load import load_model, model_dtype, model_settings
        from locos_tl.runs.provenance import provenance
        from locos_tl.trials import load_trials, trial_set_hash

        bridge = load_model(model, device=device, dtype=dtype)
        compression_twin(bridge)  # a model it cannot run (learned sinks) is refused here
        n_ctx = getattr(bridge.cfg, "n_ctx", None)
        trial_list = with_query_start(
            [t for p in trials for t in load_trials(p, bridge.tokenizer, n_ctx=n_ctx)],
            query_start)
        settings = {
            **model_settings(bridge), **options, "dtype": model_dtype(bridge),
            "n_trials": len(trial_list), "trial_set_hash": trial_set_hash(trial_list),
        }
        check_compress_resume(out, settings)
        out.mkdir(parents=True, exist_ok=True)
        meta = provenance(bridge, settings)
        meta["inputs"] = {"trials": [str(p) for p in trials], "heads": list(heads)}
        (out / META_FILE).write_text(json.dumps(meta, indent=2, default=str))
        done = done_trials(out)
        todo = [(i, t) for i, t in enumerate(trial_list) if t.trial_id not in done]
        note_resume(out, len(trial_list) - len(todo), len(trial_list))
        # HeadKV scores go with HeadKV's own (proportional) allocation
        specs = {name: (hs, "proportional" if hs.method == "headkv" else allocation)
                 for name, hs in rankings.items()}
        csv = out / CSV_FILE
        with resumable(out, ctx), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UserWarning)
            # one trial at a time: its rows are saved as soon as it is done
            for i, t in tqdm(todo, desc="compressing", unit="trial", disable=not todo):
                rows = compression_sweep(
                    bridge, [t], specs, tuple(fraction_list), unit=unit,
                    include=tuple(controls), seed=seed, allocation=allocation, sinks=sinks,
                    min_recent=min_recent, group_reduce=group_reduce,
                    max_new_tokens=max_new_tokens, progress=False)
                rows["trial_index"] = i  # the index in the whole trial list
                header = not csv.exists() or csv.stat().st_size == 0
                rows.to_csv(csv, mode="a", header=header, index=False)
        df = pd.read_csv(csv, dtype={"trial": str})
        df = df[df["trial"].isin({t.trial_id for t in trial_list})]
        floor = [w for w in caught if "below the floor" in str(w.message)]
        low = (sorted(df.loc[df["below_floor"].astype(bool), "fraction"].unique())
               if "below_floor" in df.columns else [])
        if low or floor:  # one note for the whole run, not one warning per trial
            which = f"fractions {[float(f) for f in low]}" if low else "some fractions"
            typer.secho(f"note: {which} fell below the "
                        f"sinks + recent floor ({sinks} + {min_recent} entries per unit) on "
                        "some trials: there every unit keeps about the same shrunk window; "
                        "raise the fraction or lower --sinks / --min-recent",
                        err=True, fg=typer.colors.YELLOW)
    except (LocosError, ValueError, FileNotFoundError) as exc:
        fail(exc)
    from locos_tl.plot import compression_curves

    title = f"KV-cache compression ({unit} budgets), {len(trial_list)} trials"
    y = SCORES[score]
    write_figure(compression_curves(df, title=title, y=y), out / FIGURE_FILE)
    typer.echo("\naccuracy by ranking, allocation and retained fraction "
               "(kept: share of the context cache's entries; bytes kept: of its K/V bytes)")
    typer.echo(summary_table(df).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    typer.echo(f"\nwrote {out}/ ({CSV_FILE}, {META_FILE}, {FIGURE_FILE})")
