"""An ablation sweep with and without layer-prefix reuse, on a published run's grid.

Takes a published run of ``locos reproduce`` (rankings in ``heads/``, calibration means,
``ablate/<cell>/jobs.json``) and the evaluation trials its ``trials`` stage wrote, keeps
the grid's head sets at ``--ks`` (baseline, every ranking, random seeds, bottom-k), and
runs :func:`locos_tl.ablation_sweep` on the first ``--n`` trials twice: recomputing
every prompt (``reuse_prefix=False``, the path before reuse) and from each head set's
lowest ablated layer (``reuse_prefix=True``). Prints the wall time of both, whether the
generated tokens and name margins are identical, whether the tokens equal the published
run's own generations (and how far its margins are), and the share of prompt layers
the reuse computes on the full grid::

    python benchmarks/prefix_reuse.py --n 4
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def main() -> None:
    import locos_tl as lt
    from locos_tl.experiments.protocol.common import rankings_for_ablation
    from locos_tl.experiments.protocol.stages import load_rankings
    from locos_tl.runs.records import read_records

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-nolima-v1")
    ap.add_argument("--published", default="docs/real_models/smollm2-nolima",
                    help="published run (rankings, means, jobs.json)")
    ap.add_argument("--run", default="runs/real/smollm2-135m-nolima-v1",
                    help="the run directory whose trials/ and ablate/ records to use")
    ap.add_argument("--cell", default="onehop_1000")
    ap.add_argument("--ks", default="1,5,10,20")
    ap.add_argument("--n", type=int, default=4, help="trials")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    args = ap.parse_args()

    pub, run = Path(args.published), Path(args.run)
    trials_file = run / "trials" / f"eval_{args.cell}.jsonl"
    if not trials_file.exists():
        raise SystemExit(f"no {trials_file}: run `locos reproduce --model {args.model} "
                         f"--stages trials` (same options as {pub}/args.json) first")
    ks = [int(k) for k in args.ks.split(",")]
    published_args = json.loads((pub / "args.json").read_text())
    methods = published_args["methods"]
    seeds = [int(s) for s in published_args["random_seeds"].split(",")]
    trials = lt.load_trials(trials_file)[: args.n]
    model = lt.load_model(args.model, device="cpu", dtype="float32")
    means = lt.AblationMeans.load(pub / "means.safetensors")
    head_sets = rankings_for_ablation(load_rankings(pub), methods)
    common = dict(k=ks, mode="query_mean", means=means, seeds=seeds, bottom="locos",
                  max_new_tokens=args.max_new_tokens, progress=True)
    # warm-up: the twins are built and the threads started before any clock runs
    lt.ablation_sweep(model, trials[:1], {"warm": [(0, 0)]}, k=[1], means=means,
                      random=False, bottom=None, max_new_tokens=2, progress=False)
    times, recs = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for reuse in (False, True):
            out = Path(tmp) / f"reuse_{reuse}"
            t0 = time.perf_counter()
            lt.ablation_sweep(model, trials, head_sets, out_dir=out, reuse_prefix=reuse,
                              **common)
            times[reuse] = time.perf_counter() - t0
            recs[reuse] = read_records(out)
        sets = json.loads((out / "meta.json").read_text())["settings"]["head_sets"]
    L = int(model.cfg.n_layers)
    computed = sum(L - min(h[0] for h in s) if s else 0 for s in sets.values()) + L
    n_gen = len(recs[True])
    same = all(recs[True][k]["generated"] == recs[False][k]["generated"]
               and recs[True][k].get("name_margin") == recs[False][k].get("name_margin")
               for k in recs[False])
    published = read_records(run / "ablate" / args.cell)
    matched = [k for k in recs[True] if k in published]
    same_pub = all(recs[True][k]["generated"] == published[k]["generated"] for k in matched)
    margin_diff = max((abs(recs[True][k]["name_margin"] - published[k]["name_margin"])
                       for k in matched if published[k].get("name_margin") is not None),
                      default=float("nan"))
    lines = [
        f"{args.model}, {args.cell}, {args.n} trials x {len(sets)} head sets (k in {ks}) "
        f"= {n_gen} generations",
        f"prompt layers computed with reuse: {computed / (len(sets) * L):.2f} of the full "
        "recomputation (the unablated capture included)",
        f"recompute every prompt: {times[False]:.1f} s ({times[False] / n_gen:.2f} s/gen)",
        f"reuse the layer prefix: {times[True]:.1f} s ({times[True] / n_gen:.2f} s/gen)",
        f"speed-up: {times[False] / times[True]:.2f}x",
        f"identical tokens and name margins: {same}",
        f"the published generations' tokens: {'equal' if same_pub else 'DIFFERENT'} "
        f"({len(matched)} compared); name margins within {margin_diff:.1e} nats",
    ]
    print("\n".join(lines))  # noqa: T201


if __name__ == "__main__":
    main()
