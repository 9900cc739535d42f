"""The paper's experiments on a real pretrained LLM (issue 18): one resumable command.

Stages (each writes under ``--out`` and is skipped or resumed when rerun):

1. ``trials``: detection and evaluation trials from the shipped ``everyday`` needle set,
   kept disjoint: detection uses ``--detect-haystack`` (default: the prose haystack
   shipped with locos_tl, which names no people; ``dracula`` for the shared book), the
   even-indexed names of every entry's character set and seed 101; evaluation uses
   *The Last of the Mohicans* (both parts), the odd-indexed names and seed 202. NIAH
   trials (the Wu et al. probes) on the detection haystack for "Wu on NIAH". Parametric
   and arithmetic control trials (the specificity controls).
2. ``detect``: LOCOS, Wu, attention-spatial, HeadKV and DLA in one decode pass over the
   non-literal (``onehop``) detection trials; Wu again on NIAH, whose answers are
   sentences (``--niah-max-new-tokens``, 50; the other trials' answer is a name, 16).
3. ``calibrate``: query means of every head over 50 raw-text prompts (the paper's
   ``query_mean`` ablation), cut from the evaluation books.
4. ``ablate``: top-k of every ranking, random heads (3 seeds) and bottom-k, on ``onehop``
   and ``direct`` evaluation trials (ROUGE-L F and NoLiMa's ``contains``, with bootstrap
   95 % intervals over trials) and on the controls (exact match); DS(k).
   ``--methods baseline`` generates the unablated answers only (no ranking, random or
   bottom-k): whether the model retrieves at a new length or question type at all,
   before a sweep there.
5. ``patch``: CRI activation patching on a subset of detection trials; rank agreement
   with LOCOS (Spearman, Kendall, top-k overlap).
6. ``compress``: KV-cache compression sweep under LOCOS, Wu, HeadKV, uniform and random.
7. ``report``: ``summary.json``, the headline table (``headline.csv``, per question type
   and length; random is the mean over seeds, its interval a bootstrap over trials of
   each trial's mean over seeds), the layer distribution of the top heads and the
   figures (HTML + PNG when kaleido is present). The ablation tables
   (``ablate/*/evaluation_ci.csv``) are rebuilt from every finished generation of the
   grid the report is given, so sweeps run on different grids (say the non-literal
   questions at fewer k, or 2000 tokens at one k) report together; a job with a missing
   trial is left out.

Sizes: ``--preset`` ``full`` is the issue's protocol (>= 60 evaluation trials a question
type; meant for a GPU); ``cpu`` is the reduced size this repository's committed results
were measured at on a 2-core CPU (printed in ``summary.json``). Every option can be set
alone. Nothing is tuned on the evaluation trials: needles, seeds and k are fixed here.

Growing a run: the evaluation samples nest (the 20 trials of ``--n-eval 20`` are among
the 40 of ``--n-eval 40``), the trials stage rebuilds its files when a size option
changes, and the ablation and patching stages extend their run directories
(``evaluate(..., extend=True)``, ``patch_heads(..., extend=True)``), so a larger
``--n-eval``, ``--n-cri`` or ``--n-compress`` (or a new ``--fractions`` entry) runs
only the new trials. Other size changes are refused (``TRIAL_OPTIONS``). ``--workers N``
spreads the ablated generations over N Ray actors (identical results).

Usage::

    python benchmarks/real_models.py --model smollm2-135m-instruct --out runs/real/smollm2
    python benchmarks/real_models.py --model gemma-3-270m --template completion \\
        --ks 1,5,10,20 --out runs/real/gemma3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

STAGES = ("trials", "detect", "calibrate", "ablate", "patch", "compress", "report")
DETECTORS = ("locos", "wu", "attention_spatial", "headkv", "dla")
PRESETS: dict[str, dict[str, Any]] = {
    # the protocol (GPU-sized: about 12,000 generations at 1-2k tokens)
    "full": dict(n_detect=80, n_eval=60, n_niah=30, n_control=50, n_cri=20, n_compress=40,
                 eval_lengths="1000,2000", random_seeds="0,1,2",
                 methods="locos,wu_niah,wu_nolima,attention_spatial,headkv,dla",
                 fractions="0.05,0.1,0.2,0.5,1.0", ks="1,5,10,20,50",
                 questions="onehop,direct"),
    # what a 2-core CPU affords (the committed SmolLM2 results, grown over several
    # sessions with --workers 2: about 5,700 ablated generations): the k sweep of every
    # ranking on the literal (direct) questions, where these small models retrieve; the
    # non-literal sweep and 2000 tokens are extra runs on smaller grids
    # (docs/real_models.md, "Reproduce")
    "cpu": dict(n_detect=60, n_eval=60, n_niah=12, n_control=12, n_cri=3, n_compress=40,
                eval_lengths="1000", random_seeds="0,1,2", ks="1,5,10,20,50",
                questions="direct",
                methods="locos,wu_niah,wu_nolima,attention_spatial,headkv,dla",
                fractions="0.05,0.1,0.2,0.5,1.0"),
}
DETECT_SEED, EVAL_SEED = 101, 202
#: (retrieval, control) metric pairs of the reported DS(k): the paper's, and "contains"
DS_METRICS = (("rougeL", "exact_match"), ("contains", "contains"))
DETECT_DEPTHS = (10, 30, 50, 70, 90)
EVAL_DEPTHS = (0, 25, 50, 75, 100)


# ----------------------------------------------------------------------------- helpers
def _names(item: Any, parity: int) -> Any:
    """The item with only the names of index parity ``parity`` (disjoint name sets)."""
    names = tuple(item.character_set[parity::2]) or tuple(item.character_set)
    return dataclasses.replace(item, character_set=names)


def _save(trials: list[Any], path: Path) -> None:
    import locos_tl as lt

    lt.save_trials(trials, path)


def _load(path: Path) -> list[Any]:
    import locos_tl as lt

    return lt.load_trials(path)


def _mark(out: Path, stage: str, info: dict[str, Any]) -> None:
    d = out / "stages"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{stage}.done").write_text(json.dumps(info, indent=1, default=str))


def _bootstrap(values: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """95 % percentile bootstrap interval of the mean (scipy.stats.bootstrap)."""
    from scipy.stats import bootstrap

    if len(values) < 2 or np.all(values == values[0]):
        v = float(values.mean()) if len(values) else float("nan")
        return v, v
    res = bootstrap((values,), np.mean, n_resamples=1000, confidence_level=0.95,
                    method="percentile", random_state=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


# ----------------------------------------------------------------------------- stages
def build_trials(model: Any, args: argparse.Namespace, out: Path) -> None:
    import locos_tl as lt
    from locos_tl.data.hub import load_tokenizer
    from locos_tl.data.prompt import PromptBuilder

    tok = load_tokenizer(args.model)  # the checkpoint's own tokenizer, as the CLI builds
    data = Path(args.data_dir)
    books = data / "haystack"
    detect_hay = lt.load_haystacks([_detect_haystack(args, books)])
    eval_hay = lt.load_haystacks([books / "mohicans_part1.txt", books / "mohicans_part2.txt"])
    entries = lt.load_needle_set(args.needle_set)
    chat = args.template == "chat"
    builder = PromptBuilder(tok)
    # chat models: NoLiMa's chat-style task template; base models: the completion one
    kw = {"template": "completion" if args.template == "completion" else "default"}
    for qtype in ("onehop", "direct"):
        items = lt.expand_needle_set(entries, [qtype])
        det = lt.build_nolima_trials(
            tok, [_names(i, 0) for i in items], detect_hay, lengths=[args.detect_length],
            depths=DETECT_DEPTHS, num_examples=args.n_detect, chat_template=chat,
            seed=DETECT_SEED, builder=builder, **kw)
        _save(det, out / "trials" / f"detect_{qtype}.jsonl")
        for length in _ints(args.eval_lengths):
            ev = lt.build_nolima_trials(
                tok, [_names(i, 1) for i in items], eval_hay, lengths=[length],
                depths=EVAL_DEPTHS, num_examples=args.n_eval, chat_template=chat,
                seed=EVAL_SEED, builder=builder, **kw)
            _save(ev, out / "trials" / f"eval_{qtype}_{length}.jsonl")
    probes = lt.load_niah_probes(data / "niah_needles.jsonl")
    niah = lt.build_niah_trials(tok, probes, detect_hay, lengths=[args.detect_length],
                                depths=DETECT_DEPTHS, num_examples=args.n_niah,
                                chat_template=chat, seed=DETECT_SEED, builder=builder)
    _save(niah, out / "trials" / "detect_niah.jsonl")
    n_ctx = int(model.cfg.n_ctx)
    par = lt.build_parametric_trials(tok, n=args.n_control, seed=EVAL_SEED,
                                     chat_template=chat, n_ctx=n_ctx)
    ari = lt.build_arithmetic_trials(tok, n=args.n_control, seed=EVAL_SEED,
                                     chat_template=chat, n_ctx=n_ctx)
    _save(par, out / "trials" / "control_parametric.jsonl")
    _save(ari, out / "trials" / "control_arithmetic.jsonl")
    # calibration text: raw book text from the evaluation books (no template, no BOS)
    text = " ".join(h.text for h in eval_hay)
    step = max(1, len(text) // args.n_calibration)
    prompts = [text[i * step:i * step + args.calibration_chars]
               for i in range(args.n_calibration)]
    cal = out / "trials" / "calibration.json"
    if cal.exists() and json.loads(cal.read_text()) != prompts:
        (out / "means.safetensors").unlink(missing_ok=True)  # other prompts: recalibrate
    cal.write_text(json.dumps(prompts))


#: the options the trial files depend on (a change rebuilds them). The NoLiMa samples
#: nest, so a larger ``--n-eval`` keeps every finished generation of the smaller one, and
#: a larger ``--n-cri`` every patched trial; other changes (``--n-detect``, ``--n-niah``,
#: ``--n-control``: the parametric sample does not nest) are refused by the stage's run
#: directory: use a new ``--out``
TRIAL_OPTIONS = ("model", "needle_set", "template", "data_dir", "detect_length",
                 "detect_haystack",
                 "n_detect", "n_eval", "n_niah", "n_control", "eval_lengths",
                 "n_calibration", "calibration_chars")


def _trial_sizes(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k) for k in TRIAL_OPTIONS}


def _trials_changed(out: Path, args: argparse.Namespace) -> bool:
    """True when the trial files are missing or were built with other options."""
    done = out / "stages" / "trials.done"
    if not done.exists():
        return True
    old = json.loads(done.read_text()).get("sizes")
    if old is None:  # a run from before sizes were recorded: rebuild (deterministic)
        return True
    new = _trial_sizes(args)
    if old != new:
        changed = {k: (old.get(k), v) for k, v in new.items() if old.get(k) != v}
        print(f"trials: rebuilt for changed options {changed}")  # noqa: T201
        return True
    return False


def _detect_haystack(args: argparse.Namespace, books: Path) -> Path:
    """``--detect-haystack``: ``dracula`` (the shared book), ``prose`` (the self-written
    haystack shipped with locos_tl, no named people) or a file."""
    if args.detect_haystack == "dracula":
        return books / "dracula_part1.txt"
    if args.detect_haystack == "prose":
        from locos_tl.cli.demo_real import DEFAULT_HAYSTACK

        return DEFAULT_HAYSTACK
    return Path(args.detect_haystack)


def _ints(text: str) -> list[int]:
    return [int(x) for x in str(text).split(",") if x.strip()]


def detect(model: Any, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    import locos_tl as lt

    trials = _load(out / "trials" / "detect_onehop.jsonl")
    res = lt.score_trials(model, trials, methods=list(DETECTORS), out_dir=out / "detect",
                          max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
    niah = _load(out / "trials" / "detect_niah.jsonl")
    wu_niah = lt.score_trials(model, niah, methods=["wu"], out_dir=out / "detect_niah",
                              max_new_tokens=args.niah_max_new_tokens,
                              batch_size=args.batch_size)
    res = dict(res)
    res["wu_niah"] = wu_niah["wu"]
    return res


def load_rankings(out: Path) -> dict[str, Any]:
    from locos_tl.runs.rundir import load_head_scores

    res = {m: load_head_scores(out / "detect", m) for m in DETECTORS}
    res["wu_niah"] = load_head_scores(out / "detect_niah", "wu")
    return res


def _methods(methods: str) -> list[str]:
    return [m.strip() for m in methods.split(",") if m.strip()]


def _baseline_only(methods: str) -> bool:
    """``--methods baseline``: the unablated answers only (no ranking, random, bottom-k)."""
    return _methods(methods) == ["baseline"]


def rankings_for_ablation(scores: dict[str, Any], methods: str) -> dict[str, Any]:
    """The head sets the ablation sweeps (``--methods``; Wu on NoLiMa is ``wu_nolima``;
    ``baseline`` alone: none)."""
    names = {"locos": "locos", "wu_niah": "wu_niah", "wu_nolima": "wu",
             "attention_spatial": "attention_spatial", "headkv": "headkv", "dla": "dla"}
    if _baseline_only(methods):
        return {}
    out = {}
    for new in _methods(methods):
        if new not in names:
            raise SystemExit(f"unknown --methods entry {new!r}; choose from "
                             f"{sorted(names)}, or 'baseline' alone")
        hs = scores.get(names[new])
        if hs is not None and hs.n_trials > 0:
            out[new] = hs
        else:
            print(f"ablation: {new} accepted no detection trial; left out")  # noqa: T201
    return out


def calibrate(model: Any, args: argparse.Namespace, out: Path) -> Any:
    import locos_tl as lt

    path = out / "means.safetensors"
    if path.exists():
        return lt.AblationMeans.load(path)
    prompts = json.loads((out / "trials" / "calibration.json").read_text())
    means = lt.calibrate_means(model, prompts, max_tokens=args.calibration_tokens,
                               progress=True)
    means.save(path)
    return means


#: Ray runs its worker processes at nice 15, so any other process on the machine takes
#: their CPU; the sweep's workers do all of its work, so they run at the default 0
RAY_NICE_0 = {"runtime_env": {"env_vars": {"RAY_worker_niceness": "0"}}}


def ablate(model: Any, args: argparse.Namespace, out: Path, scores: dict[str, Any],
           means: Any) -> None:
    import locos_tl as lt

    head_sets = rankings_for_ablation(scores, args.methods)
    ks = _ints(args.ks)
    common = dict(k=ks, mode="query_mean", means=means, seeds=_ints(args.random_seeds),
                  bottom="locos", max_new_tokens=args.eval_max_new_tokens,
                  workers=args.workers, extend=True)  # --n-eval may grow (nested)
    if _baseline_only(args.methods):
        common.update(random=False, bottom=None)
    if args.workers > 1:  # Ray starts workers at nice 15: a sweep owns the machine
        common["ray_init_kwargs"] = RAY_NICE_0
    for length in _ints(args.eval_lengths):
        for qtype in _questions(args):
            trials = _load(out / "trials" / f"eval_{qtype}_{length}.jsonl")
            lt.evaluate(model, trials, head_sets, scorer="nolima",
                        out_dir=out / "ablate" / f"{qtype}_{length}", **common)
    # the controls may run a subset of the (k, seed) grid (``--control-ks``,
    # ``--control-seeds``): DS(k) is reported where both sides exist
    control = {**common, "max_new_tokens": 16,
               "k": _ints(args.control_ks or args.ks),
               "seeds": _ints(args.control_seeds or args.random_seeds)}
    for name in ("parametric", "arithmetic"):
        trials = _load(out / "trials" / f"control_{name}.jsonl")
        lt.evaluate(model, trials, head_sets, scorer="control",
                    out_dir=out / "ablate" / f"control_{name}", **control)


def trial_values(run: Path, trials: list[Any], scorer: str,
                 keys: dict[tuple[str, int, int], str]) -> pd.DataFrame:
    """Every complete job's per-trial scores, from the run's records: one row per (job,
    trial, metric), columns ``method``, ``k``, ``seed``, ``heads_key``, ``trial``,
    ``metric``, ``value``, in ``keys``' order and the records' order within a job.

    ``keys``: (method, k, seed) -> head-set key (:func:`job_keys`). A job whose records
    miss a trial of ``trials`` is left out (a sweep still running, or a grid that a
    later call grew); the records hold every finished generation, so sweeps run on
    different grids (a ragged grid) report together.
    """
    from locos_tl.experiments.run_table import score_records

    per = score_records(run, trials, scorer)
    n = len({t.trial_id for t in trials})
    parts = [per[per["heads_key"] == key].assign(method=method, k=k, seed=seed)
             for (method, k, seed), key in keys.items()]
    parts = [sub for sub in parts if sub["trial"].nunique() == n]
    cols = ["method", "k", "seed", "heads_key", "trial", "metric", "value"]
    if not parts:
        return pd.DataFrame(columns=cols)
    return pd.concat(parts, ignore_index=True)[cols]


def interval_table(values: pd.DataFrame) -> pd.DataFrame:
    """One row per (method, k, seed, metric) of :func:`trial_values`: the mean over
    trials (as ``evaluate`` computes it) and a bootstrap 95 % interval over trials."""
    rows = []
    for (method, k, seed), job in values.groupby(["method", "k", "seed"], sort=False):
        for metric, g in job.groupby("metric", sort=False):
            v = g["value"].to_numpy(dtype=float)
            lo, hi = _bootstrap(v)
            rows.append({"method": method, "k": int(k), "seed": int(seed), "metric": metric,
                         "value": float(v.mean()), "n_trials": len(v),
                         "ci_low": lo, "ci_high": hi})
    return pd.DataFrame(rows, columns=["method", "k", "seed", "metric", "value",
                                       "n_trials", "ci_low", "ci_high"])


def evaluation_table(run: Path, trials: list[Any], scorer: str,
                     keys: dict[tuple[str, int, int], str]) -> pd.DataFrame:
    """The sweep's table (``evaluation_ci.csv``), rebuilt from the run's records: one
    row per complete job and metric of ``keys`` ((method, k, seed) -> head-set key,
    :func:`job_keys`), with a bootstrap 95 % interval over trials
    (:func:`trial_values`, :func:`interval_table`). The runs published so far predate
    ``jobs.json`` (:func:`locos_tl.load_evaluation`), so the cells come from the grid
    the report is given. ``value`` is the mean over trials, as ``evaluate`` computes it.
    """
    return interval_table(trial_values(run, trials, scorer, keys))


def job_keys(args: argparse.Namespace, scores: dict[str, Any], L: int, H: int,
             control: bool = False) -> dict[tuple[str, int, int], str]:
    """(method, k, seed) -> head-set key, from the same jobs :func:`ablate` ran (with
    ``control``: the control runs' grid, ``--control-ks`` and ``--control-seeds``)."""
    from locos_tl.experiments.evaluate import build_jobs

    ks, seeds = args.ks, args.random_seeds
    if control:
        ks, seeds = args.control_ks or ks, args.control_seeds or seeds
    only = _baseline_only(args.methods)
    jobs = build_jobs(rankings_for_ablation(scores, args.methods), _ints(ks),
                      n_layers=L, n_heads=H, seeds=_ints(seeds), random=not only,
                      bottom=None if only else "locos")
    return {(j.method, j.k, j.seed): j.key for j in jobs}


def patch(model: Any, args: argparse.Namespace, out: Path, scores: dict[str, Any]) -> Any:
    import locos_tl as lt

    trials = _load(out / "trials" / "detect_onehop.jsonl")
    accepted = _accepted(out / "detect", "locos")
    subset = [t for t in trials if t.trial_id in accepted][: args.n_cri]
    if not subset:
        print("patch: no accepted detection trial; CRI skipped")  # noqa: T201
        return None
    cri = saved_cri(model, args, out, subset)
    if cri is None:
        cri = lt.patch_heads(model, subset, out_dir=out / "patch",
                             max_new_tokens=args.max_new_tokens, extend=True)  # --n-cri grows
        cri.save(out / "heads" / "cri")
    n = int(model.cfg.n_layers) * int(model.cfg.n_heads)
    ks = tuple(k for k in (5, 10, 20, 50) if k <= n)
    for name in ("locos", "wu", "dla", "attention_spatial", "headkv"):
        if name in scores and scores[name].n_trials:
            agree = lt.compare_rankings(scores[name], cri, ks=ks)
            agree.to_csv(out / "patch" / f"agreement_{name}_cri.csv", index=False)
    return cri


def saved_cri(model: Any, args: argparse.Namespace, out: Path, subset: list[Any]) -> Any:
    """CRI saved in ``heads/cri`` over exactly ``subset`` (same trials in the same order:
    ``trial_set_hash``; same model, dtype and greedy budget) when ``patch/trials.jsonl``
    lacks some of their records, else None. A run resumed from a directory published
    before the records were (``PUBLISHED``) has the scores but not the records; without
    this its patch stage would patch every head on every trial again (hours on a CPU) to
    get the same numbers. A larger ``--n-cri`` still needs the records (or patches every
    trial again)."""
    import locos_tl as lt
    from locos_tl.models.load import model_dtype, model_name
    from locos_tl.runs.records import read_records
    from locos_tl.trials import trial_set_hash

    path = out / "heads" / "cri"
    if not (path / "head_scores.json").exists():
        return None
    if {t.trial_id for t in subset} <= read_records(out / "patch").keys():
        return None  # patch_heads reuses its own records
    cri = lt.HeadScores.load(path)
    got = cri.meta.get("settings", {})
    want = {"model": model_name(model), "dtype": model_dtype(model),
            "max_new_tokens": args.max_new_tokens, "trial_set_hash": trial_set_hash(subset)}
    if {k: got.get(k) for k in want} != want:  # the hash covers every trial, in order
        return None
    print(f"patch: CRI over {len(subset)} trials reused from {path} "  # noqa: T201
          "(its per-trial patching records are not in this run)")
    return cri


def _accepted(run: Path, method: str) -> set[str]:
    ids = set()
    with open(run / "trials.jsonl") as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("accepted"):  # the LOCOS answer-step rule
                ids.add(rec["trial_id"])
    return ids


def compress_trials(args: argparse.Namespace, out: Path) -> list[Any]:
    """The first ``--n-compress / 2`` evaluation trials of each question type, tagged
    with their ``task``."""
    trials = []
    length = _ints(args.eval_lengths)[0]
    for qtype in ("onehop", "direct"):
        ev = _load(out / "trials" / f"eval_{qtype}_{length}.jsonl")[: args.n_compress // 2]
        trials += [dataclasses.replace(t, meta={**t.meta, "task": qtype}) for t in ev]
    return trials


def compress(model: Any, args: argparse.Namespace, out: Path, scores: dict[str, Any]) -> None:
    """The compression sweep, resumable one (trial, fraction) at a time: a rerun decodes
    only the pairs ``compression.csv`` lacks, so a larger ``--n-compress`` or a new
    fraction adds just those. Rows of trials or fractions no longer selected move to
    ``compression.previous.csv``; other rankings or decoding settings restart the sweep
    (the old file moves there too)."""
    from tqdm.auto import tqdm

    from locos_tl.cli.compress import ranking_hash  # what `locos compress` records
    from locos_tl.experiments.compress import compression_sweep

    path = out / "compress" / "compression.csv"
    settings_path = path.with_name("settings.json")
    trials = compress_trials(args, out)
    fractions = _floats(args.fractions)
    rankings = {m: scores[m] for m in ("locos", "wu", "headkv") if scores[m].n_trials > 0}
    settings = {"rankings": {m: ranking_hash(hs) for m, hs in rankings.items()},
                "include": ["uniform", "random"], "seed": 0, "unit": "query_head",
                "max_new_tokens": args.max_new_tokens}
    path.parent.mkdir(parents=True, exist_ok=True)
    old = pd.read_csv(path, dtype={"trial": str}) if path.exists() else None
    if old is not None and settings_path.exists() and \
            json.loads(settings_path.read_text()) != settings:
        print(f"compress: {path} has other rankings or settings; moved to "  # noqa: T201
              "compression.previous.csv and rerun")
        _set_aside(old, path)
        path.unlink()
        old = None
    # a sweep written before settings.json existed is taken as made with these rankings
    settings_path.write_text(json.dumps(settings, indent=1))
    order = {t.trial_id: i for i, t in enumerate(trials)}  # the index in this selection
    if old is not None:
        keep = old["trial"].isin(order) & old["fraction"].isin(fractions)
        if not keep.all():
            _set_aside(old[~keep], path)
        old = old[keep].copy()
        old["trial_index"] = old["trial"].map(order)
        old.to_csv(path, index=False)
    done = set() if old is None else set(zip(old["trial"], old["fraction"], strict=True))
    todo = [(i, t, [f for f in fractions if (t.trial_id, f) not in done])
            for i, t in enumerate(trials)]
    todo = [job for job in todo if job[2]]
    for i, t, fracs in tqdm(todo, desc="compression sweep", unit="trial"):
        rows = compression_sweep(model, [t], rankings, fracs, unit="query_head",
                                 include=("uniform", "random"), seed=0,
                                 max_new_tokens=args.max_new_tokens, progress=False)
        rows["trial_index"] = i  # the index in this run's compression trials
        rows.to_csv(path, mode="a", header=not path.exists(), index=False)


def _set_aside(rows: pd.DataFrame, path: Path) -> None:
    """Append ``rows`` to ``compression.previous.csv`` beside ``path``."""
    prev = path.with_name("compression.previous.csv")
    rows.to_csv(prev, mode="a", header=not prev.exists(), index=False)


def compression_accuracy(df: pd.DataFrame) -> pd.DataFrame:
    """Answer accuracy ("contains") per ranking x fraction x task, with the number of
    trials and a 95 % bootstrap interval over trials."""
    rows = []
    for (ranking, frac, task), sel in df.groupby(["ranking", "fraction", "task"]):
        v = sel["answer_correct"].astype(float).to_numpy()
        lo, hi = _bootstrap(v)
        rows.append({"ranking": ranking, "fraction": frac, "task": task,
                     "n_trials": len(v), "accuracy": float(v.mean()),
                     "ci_low": lo, "ci_high": hi})
    return pd.DataFrame(rows)


def _questions(args: argparse.Namespace) -> list[str]:
    return [q.strip() for q in args.questions.split(",") if q.strip()]


def _floats(text: str) -> list[float]:
    return [float(x) for x in str(text).split(",") if x.strip()]


# ----------------------------------------------------------------------------- report
def headline(tables: dict[tuple[str, int], pd.DataFrame], k_head: int,
             values: dict[tuple[str, int], pd.DataFrame] | None = None) -> pd.DataFrame:
    """Baseline / LOCOS / Wu (NIAH, NoLiMa) / attention-spatial / random at ``k_head``,
    per question type and length, beside the paper's Qwen3-8B numbers (ROUGE-L F,
    non-literal NoLiMa). ``tables``: (question, length) -> :func:`evaluation_table`.
    Where a table has no LOCOS cell at ``k_head`` (a smaller grid, e.g. one k at 2000
    tokens), its row is at the largest k below it that LOCOS has.

    Random is the mean over the seeds run. Its interval is a bootstrap over trials of
    each trial's mean over the seeds, from ``values`` ((question, length) ->
    :func:`trial_values`); without them, or when a seed lacks a trial, the interval is
    left empty (NaN), since averaging the seeds' own intervals gives no interval."""
    paper = {"baseline": 0.40, "locos": 0.00, "wu_niah": 0.29, "wu_nolima": 0.34,
             "random": 0.40, "attention_spatial": 0.15}
    rows = []
    for (qtype, length), ev in tables.items():
        run_ks = ev.loc[(ev["method"] == "locos") & (ev["k"] <= k_head), "k"]
        k_at = int(run_ks.max()) if len(run_ks) else k_head
        for method, ref in paper.items():
            k = 0 if method == "baseline" else k_at
            sel = ev[(ev["metric"] == "rougeL") & (ev["method"] == method) & (ev["k"] == k)]
            if sel.empty:
                continue
            lo, hi = sel["ci_low"].iloc[0], sel["ci_high"].iloc[0]
            if len(sel) > 1:  # seeds: pool them per trial
                lo = hi = np.nan
                vals = (values or {}).get((qtype, length))
                if vals is not None:
                    v = vals[(vals["metric"] == "rougeL") & (vals["method"] == method)
                             & (vals["k"] == k)]
                    by_trial = v.pivot_table(index="trial", columns="seed", values="value")
                    if sorted(by_trial.columns) == sorted(sel["seed"]) \
                            and not by_trial.isna().any().any():
                        lo, hi = _bootstrap(by_trial.mean(axis=1).to_numpy())
            rows.append({"question": qtype, "length": length, "method": method, "k": k,
                         "rougeL": sel["value"].mean(), "ci_low": lo, "ci_high": hi,
                         "n_seeds": len(sel), "n_trials": int(sel["n_trials"].iloc[0]),
                         "paper_qwen3_8b": ref if qtype == "onehop" else np.nan})
    return pd.DataFrame(rows)


def report(model: Any, args: argparse.Namespace, out: Path, scores: dict[str, Any]) -> None:
    import locos_tl as lt
    from locos_tl.experiments.evaluate import dissociation_score

    figs = out / "figures"
    figs.mkdir(parents=True, exist_ok=True)
    ks = _ints(args.ks)
    k_head = max(ks)
    L, H = int(model.cfg.n_layers), int(model.cfg.n_heads)
    keys = job_keys(args, scores, L, H)
    tables = {}  # (question, length) -> the sweep's table, from the records
    values = {}  # (question, length) -> its per-trial scores
    for length in _ints(args.eval_lengths):
        for qtype in ("onehop", "direct"):
            run = out / "ablate" / f"{qtype}_{length}"
            if not (run / "trials.jsonl").exists():
                continue
            trials = _load(out / "trials" / f"eval_{qtype}_{length}.jsonl")
            values[qtype, length] = trial_values(run, trials, "nolima", keys)
            ev = interval_table(values[qtype, length])
            ev.to_csv(run / "evaluation_ci.csv", index=False)
            tables[qtype, length] = ev
    head = headline(tables, k_head, values)
    head.to_csv(out / "headline.csv", index=False)
    summary: dict[str, Any] = {"model": args.model, "n_layers": L, "n_heads": H,
                               "preset": args.preset, "settings": vars(args)}
    for name, hs in scores.items():
        summary.setdefault("n_accepted", {})[name] = int(hs.n_trials)
        if hs.n_trials:
            summary.setdefault("top10", {})[name] = [lt.head_label(*h) for h in hs.top_k(10)]
            hs.save(out / "heads" / name)  # head_scores.json, heads.json, scores.csv
    window = _sliding_layers(model)
    if window is not None:
        full = [l for l in range(L) if l not in window]
        summary["full_attention_layers"] = full
        for name in ("locos", "wu", "wu_niah"):
            if name in scores and scores[name].n_trials:
                top = scores[name].top_k(min(k_head, L * H))
                summary.setdefault("top_k_on_full_layers", {})[name] = sum(
                    1 for l, _ in top if l in full)
    controls = {}  # the control runs' tables, from their records
    for control in ("parametric", "arithmetic"):
        c = out / "ablate" / f"control_{control}"
        if (c / "trials.jsonl").exists():
            controls[control] = evaluation_table(
                c, _load(out / "trials" / f"control_{control}.jsonl"), "control",
                job_keys(args, scores, L, H, control=True))
    length = _ints(args.eval_lengths)[0]  # DS(k) at the first length
    ds_rows = []
    for (qtype, at), ev in tables.items():
        if set(ev["method"]) <= {"baseline"}:  # nothing run yet, or --methods baseline
            continue
        # k on a log axis: 1, 5, 10, 20, 50 spread out; the baseline is a dashed line
        fig = lt.plot.ablation_curves(ev, metrics=["rougeL", "contains"], log_x=True,
                                      title=f"{args.model}: {qtype} at {at} tokens")
        _write(fig, figs / f"ablation_{qtype}_{at}")
        if at != length:
            continue
        for control, cev in controls.items():
            # the paper's metrics (ROUGE-L F / exact match), and "contains" on both
            # sides: a chat model that answers in a sentence scores exact match 0
            for r_metric, c_metric in DS_METRICS:
                ds = dissociation_score(ev, cev, retrieval_metric=r_metric,
                                        control_metric=c_metric)
                ds["question"], ds["control"] = qtype, control
                ds["retrieval_metric"], ds["control_metric"] = r_metric, c_metric
                ds_rows.append(ds)
    if ds_rows:
        ds = pd.concat(ds_rows, ignore_index=True)
        ds.to_csv(out / "dissociation.csv", index=False)
        for qtype in _questions(args):
            sub = ds[(ds["question"] == qtype) & (ds["control"] == "parametric")
                     & (ds["retrieval_metric"] == "contains")]
            if not sub.empty and sub["ds"].notna().any():
                _write(lt.plot.dissociation(sub, title=f"{args.model}: DS(k), {qtype} vs "
                                            "parametric (contains)"),
                       figs / f"dissociation_{qtype}")
    for name in ("locos", "wu", "wu_niah"):
        if name in scores and scores[name].n_trials:
            _write(lt.plot.head_heatmap(scores[name], title=f"{args.model}: {name}"),
                   figs / f"heatmap_{name}")
    valid = [scores[m] for m in ("locos", "wu_niah", "wu") if m in scores
             and scores[m].n_trials]
    _write(lt.plot.layer_distribution(valid, k=min(20, L * H)), figs / "layer_distribution")
    for agree in sorted((out / "patch").glob("agreement_*_cri.csv")):
        name = agree.stem.removeprefix("agreement_").removesuffix("_cri")
        summary.setdefault("vs_cri", {})[name] = (
            pd.read_csv(agree).iloc[0].to_dict())  # the "all heads" bucket
    comp = out / "compress" / "compression.csv"
    if comp.exists():
        df = pd.read_csv(comp)
        _write(lt.plot.compression_curves(df, y="answer_correct"), figs / "compression")
        compression_accuracy(df).to_csv(out / "compress" / "accuracy.csv", index=False)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(head.to_string(index=False))  # noqa: T201
    if args.publish:
        publish(out, Path(args.publish))


#: the small result files copied into the docs (``--publish``); the run keeps the rest
PUBLISHED = ("summary.json", "headline.csv", "dissociation.csv", "args.json",
             "detect/meta.json", "detect/trials.jsonl",  # detection records (resume)
             "detect_niah/meta.json", "detect_niah/trials.jsonl",
             "means.safetensors",  # the calibrated query means (resume: see RESUMABLE)
             "patch/agreement_*_cri.csv", "compress/accuracy.csv",
             "compress/compression.csv",  # every compressed answer
             "ablate/*/evaluation_ci.csv",  # every job of the grid, from the records
             "ablate/*/trials.jsonl", "ablate/*/meta.json",  # every response (resume)
             "ablate/*/jobs.json",  # every cell of every call (meta.json: the last call)
             "heads/*/head_scores.json", "heads/*/heads.json",
             "patch/trials.jsonl", "patch/meta.json",  # CRI's records (resume, grow)
             "figures/*.png", "stages/*.done")  # CRI: heads/cri


def publish(out: Path, dest: Path) -> None:
    """Copy the run's small result files (tables, head scores, PNG figures) to ``dest``."""
    import shutil

    for pattern in PUBLISHED:
        for src in sorted(out.glob(pattern)):
            target = dest / src.relative_to(out)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)


#: what a run reads back to go on where it stopped, copied from a published directory by
#: ``--resume-from``: the detection and ablation records, the cells, the calibrated query
#: means (recalibrating on another CPU changes their last bits, and a run refuses to mix
#: means: ``means_hash``), CRI's records, scores and agreements (runs published before
#: the records were: :func:`saved_cri`) and the compressed answers. The
#: trial files are not among them: the ``trials`` stage rebuilds them (deterministic).
RESUMABLE = ("means.safetensors", "detect/meta.json", "detect/trials.jsonl",
             "detect_niah/meta.json", "detect_niah/trials.jsonl",
             "ablate/*/trials.jsonl", "ablate/*/jobs.json", "ablate/*/meta.json",
             "patch/agreement_*_cri.csv", "patch/trials.jsonl", "patch/meta.json",
             "heads/cri/head_scores.json", "heads/cri/heads.json",
             "compress/compression.csv")


def resume_from(src: Path, out: Path) -> list[str]:
    """Copy the files of :data:`RESUMABLE` from a published run ``src`` into the run
    directory ``out`` where ``out`` lacks them (a file already there is kept), so a run
    made on another machine (say the committed ``docs/real_models/smollm2``) goes on
    here. Returns the copied paths, relative to ``out``.

    Raises:
        FileNotFoundError: ``src`` is not a directory or holds none of them.
    """
    import shutil

    if not src.is_dir():
        raise FileNotFoundError(f"--resume-from {src}: not a directory")
    found = [f for pattern in RESUMABLE for f in sorted(src.glob(pattern))]
    if not found:
        raise FileNotFoundError(f"--resume-from {src}: holds no file a run reads back "
                                f"({', '.join(RESUMABLE[:3])}, ...)")
    copied = []
    for f in found:
        target = out / f.relative_to(src)
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)
        copied.append(str(f.relative_to(src)))
    return copied


def _sliding_layers(model: Any) -> set[int] | None:
    cfg = getattr(getattr(model, "original_model", None), "config", None)
    types = getattr(cfg, "layer_types", None)
    if not types:
        return None
    return {i for i, t in enumerate(types) if "sliding" in str(t)}


def _write(fig: Any, stem: Path) -> None:
    """``stem.html`` and ``stem.png`` (kaleido or headless Chromium; HTML only if neither)."""
    import sys

    fig.write_html(str(stem) + ".html", include_plotlyjs="cdn")
    scripts = str(Path(__file__).resolve().parents[1] / "docs" / "scripts")
    if scripts not in sys.path:  # once, not once per figure
        sys.path.insert(0, scripts)
    from render_figures import save_png

    print(save_png(fig, Path(str(stem) + ".png")))  # noqa: T201


# ----------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--out", default=None, help="run directory (default runs/real/<model>)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    ap.add_argument("--needle-set", default="everyday")
    ap.add_argument("--template", choices=("chat", "completion"), default="chat")
    ap.add_argument("--data-dir", default="../shared/data",
                    help="folder with haystack/*.txt and niah_needles.jsonl")
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--detect-length", type=int, default=1000)
    ap.add_argument("--detect-haystack", default="prose",
                    help="detection book: dracula (shared), prose (shipped, no named "
                         "people) or a text file; evaluation always uses Mohicans")
    ap.add_argument("--max-new-tokens", type=int, default=16,
                    help="greedy budget of the NoLiMa detection trials and CRI (the answer is "
                         "a name)")
    ap.add_argument("--eval-max-new-tokens", type=int, default=16)
    ap.add_argument("--niah-max-new-tokens", type=int, default=50,
                    help="greedy budget of the NIAH detection trials (Wu on NIAH): their "
                         "answers are sentences of 16-25 tokens, which 16 tokens cut off "
                         "before the trial gate (ROUGE-1 recall > 0.5) can pass; 50 is "
                         "the paper's scoring budget")
    ap.add_argument("--control-ks", default=None,
                    help="k values of the control runs (default: --ks)")
    ap.add_argument("--control-seeds", default=None,
                    help="random seeds of the control runs (default: --random-seeds)")
    ap.add_argument("--n-calibration", type=int, default=50)
    ap.add_argument("--calibration-chars", type=int, default=4000)
    ap.add_argument("--calibration-tokens", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--workers", type=int, default=1,
                    help="ablation stage: spread the generations over this many Ray "
                         "actors (one CPU core or GPU each; identical results)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default=None)
    ap.add_argument("--resume-from", default=None,
                    help="a published run directory (e.g. docs/real_models/smollm2): "
                         "copy its records, cells and calibration means into --out "
                         "where missing, so the run goes on on this machine; run the "
                         "trials stage with it (the trial files are rebuilt)")
    ap.add_argument("--publish", default=None,
                    help="copy the small result files here after the report "
                         "(e.g. docs/real_models/smollm2)")
    for key in PRESETS["full"]:
        ap.add_argument("--" + key.replace("_", "-"), default=None,
                        type=int if key.startswith("n_") else str)
    args = ap.parse_args(argv)
    for key, v in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, v)
    if args.out is None:
        args.out = f"runs/real/{args.model.replace('/', '_')}"
    return args


def main(argv: list[str] | None = None) -> int:
    import locos_tl as lt

    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        raise SystemExit(f"unknown stage(s) {unknown}; choose from {list(STAGES)}")
    (out / "args.json").write_text(json.dumps(vars(args), indent=1))
    if args.resume_from:
        if "trials" not in stages and not (out / "trials").is_dir():
            raise SystemExit("--resume-from: add the trials stage (--stages trials,...): "
                             "the trial files are rebuilt here, not copied")
        copied = resume_from(Path(args.resume_from), out)
        print(f"resume: {len(copied)} file(s) copied from {args.resume_from}")  # noqa: T201
    model = lt.load_model(args.model, dtype=args.dtype, device=args.device)
    timings: dict[str, float] = {}
    scores: dict[str, Any] | None = None
    means = None
    for stage in STAGES:
        if stage not in stages:
            continue
        t0 = time.perf_counter()
        if stage == "trials":
            if _trials_changed(out, args):
                build_trials(model, args, out)
        elif stage == "detect":
            scores = detect(model, args, out)
        elif stage == "calibrate":
            means = calibrate(model, args, out)
        else:
            if scores is None:
                scores = load_rankings(out)
            if stage == "ablate":
                means = means or calibrate(model, args, out)
                ablate(model, args, out, scores, means)
            elif stage == "patch":
                patch(model, args, out, scores)
            elif stage == "compress":
                compress(model, args, out, scores)
            elif stage == "report":
                report(model, args, out, scores)
        timings[stage] = round(time.perf_counter() - t0, 1)
        info: dict[str, Any] = {"seconds": timings[stage]}
        if stage == "trials":
            info["sizes"] = _trial_sizes(args)
        _mark(out, stage, info)
        print(f"[{stage}] {timings[stage]} s", flush=True)  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
