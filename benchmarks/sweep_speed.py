"""Wall time of a published ablation grid: recomputing every prompt, reusing the layer
prefix, and scoring teacher forced (no decoding).

Takes a published run of ``locos reproduce`` (``heads/``, ``means.safetensors``,
``ablate/<cell>/jobs.json``) and the trials its ``trials`` stage rebuilt, keeps the
cell's published head sets at ``--ks`` (baseline, each ranking, random seeds,
bottom-k) and runs them on the first trials of the cell:

- ``recompute``: :func:`locos_tl.ablation_sweep` with ``reuse_prefix=False`` (every
  prompt computed from layer 0: the sweep as it ran before layer-prefix reuse);
- ``reuse``: the same sweep from each head set's lowest ablated layer (the default);
- ``teacher_forced``: :func:`locos_tl.teacher_forced_sweep` (answer log-probability,
  no generated text).

Each path writes into ``--work/<path>`` and resumes there; a call times only the work it
does (seconds per cell = wall time / cells computed in this call). It prints the
seconds per cell, the speed-ups, whether ``reuse`` and ``recompute`` generate the same
tokens, and whether both equal the published generations. ``--n`` sets the trials of
each path: ``recompute:8,reuse:60,teacher_forced:8``. Results go to
``--work/summary.json``::

    locos reproduce --model smollm2-135m-instruct --out runs/real/smollm2 \\
        --resume-from docs/real_models/smollm2 --stages trials \\
        --eval-lengths 1000,2000 --questions direct,onehop
    python benchmarks/sweep_speed.py --n recompute:8,reuse:8,teacher_forced:8
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

PATHS = ("recompute", "reuse", "teacher_forced")


def _grid(pub: Path, cell: str, ks: list[int]) -> tuple[dict, list[int], set[str]]:
    """The rankings, random seeds and head-set keys of the published cell at ``ks``."""
    from locos_tl.experiments.protocol.stages import load_rankings

    jobs = [j for j in json.loads((pub / "ablate" / cell / "jobs.json").read_text())["jobs"]
            if j["k"] == 0 or j["k"] in ks]
    methods = sorted({j["method"] for j in jobs if j["method"] not in ("baseline", "random")
                      and not j["method"].endswith("_bottom")})
    rankings = load_rankings(pub)
    seeds = sorted({int(j["seed"]) for j in jobs if j["method"] == "random"})
    return {m: rankings[m] for m in methods}, seeds, {j["heads_key"] for j in jobs}


def main() -> None:
    import locos_tl as lt
    from locos_tl.runs.records import read_records

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--published", default="docs/real_models/smollm2")
    ap.add_argument("--run", default="runs/real/smollm2",
                    help="run directory whose trials/ the `trials` stage rebuilt")
    ap.add_argument("--cell", default="onehop_1000")
    ap.add_argument("--ks", default="1,5,10,20")
    ap.add_argument("--n", default="recompute:8,reuse:8,teacher_forced:8",
                    help="trials per path, path:n,...")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--work", default="runs/bench/sweep_speed")
    ap.add_argument("--dtype", default="float32", help="float32 or bfloat16")
    args = ap.parse_args()

    pub, run, work = Path(args.published), Path(args.run), Path(args.work)
    trials_file = run / "trials" / f"eval_{args.cell}.jsonl"
    if not trials_file.exists():
        raise SystemExit(f"no {trials_file}: run the `trials` stage first (module docstring)")
    ks = [int(k) for k in args.ks.split(",")]
    n_of = {p: int(n) for p, n in (x.split(":") for x in args.n.split(","))}
    rankings, seeds, keys = _grid(pub, args.cell, ks)
    all_trials = lt.load_trials(trials_file)
    model = lt.load_model(args.model, device="cpu", dtype=args.dtype)
    means = lt.AblationMeans.load(pub / "means.safetensors")
    grid = dict(k=ks, mode="query_mean", means=means, seeds=seeds, bottom="locos",
                progress=True)
    lt.ablation_sweep(model, all_trials[:1], {"warm": [(0, 0)]}, k=[1], means=means,
                      random=False, bottom=None, max_new_tokens=2, progress=False)
    summary_file = work / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    for path in PATHS:
        if path not in n_of:
            continue
        trials, out = all_trials[: n_of[path]], work / path
        before = len(read_records(out)) if out.exists() else 0
        t0 = time.perf_counter()
        if path == "teacher_forced":
            lt.teacher_forced_sweep(model, trials, rankings, out_dir=out, **grid)
        else:
            lt.ablation_sweep(model, trials, rankings, out_dir=out, extend=True,
                              reuse_prefix=path == "reuse",
                              max_new_tokens=args.max_new_tokens, **grid)
        seconds = time.perf_counter() - t0
        recs = read_records(out)
        made = {r["heads_key"] for r in recs.values()}
        if made != keys:
            raise SystemExit(f"{path}: head sets {sorted(made ^ keys)} differ from the "
                             f"published cell's")
        done = len(recs) - before
        entry = summary.setdefault(path, {"seconds": 0.0, "cells": 0})
        entry["seconds"] += seconds
        entry["cells"] += done
        entry["trials"] = n_of[path]
        entry["records"] = len(recs)
    published = read_records(pub / "ablate" / args.cell)
    rec = {p: read_records(work / p) for p in ("recompute", "reuse") if (work / p).exists()}
    for p, r in rec.items():
        same = [k for k in r if k in published]
        summary[p]["published_compared"] = len(same)
        summary[p]["published_equal"] = sum(r[k]["generated"] == published[k]["generated"]
                                            for k in same)
    if len(rec) == 2:
        both = [k for k in rec["recompute"] if k in rec["reuse"]]
        summary["reuse_vs_recompute"] = {
            "compared": len(both),
            "equal": sum(rec["reuse"][k]["generated"] == rec["recompute"][k]["generated"]
                         for k in both)}
    work.mkdir(parents=True, exist_ok=True)
    summary_file.write_text(json.dumps(summary, indent=1))
    rate = {p: e["seconds"] / e["cells"] for p, e in summary.items()
            if p in PATHS and e.get("cells")}
    print(f"{args.model} ({args.dtype}), {args.cell}, k in {ks}, {len(keys)} head sets")  # noqa: T201
    for p, s in rate.items():
        e = summary[p]
        line = (f"{p:>15}: {e['cells']} cells in {e['seconds']:.0f} s = {s:.2f} s/cell; "
                f"{rate.get('recompute', s) / s:.2f}x recompute")
        if "published_equal" in e:
            line += f"; published tokens equal {e['published_equal']}/{e['published_compared']}"
        print(line)  # noqa: T201
    if "reuse_vs_recompute" in summary:
        c = summary["reuse_vs_recompute"]
        print(f"reuse vs recompute: {c['equal']}/{c['compared']} generations identical")  # noqa: T201


if __name__ == "__main__":
    main()
