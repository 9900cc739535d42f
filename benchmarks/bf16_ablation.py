"""bfloat16 against float32 on CPU: the ablation cells of a published real-model run.

Reruns one k of a published ablation grid (``locos reproduce --publish``) in bfloat16,
with the run's float32 rankings and calibration means, on the run's evaluation trials,
and compares every generation with the published float32 one. Prints, per cell: the
share of answers naming the target in float32 and in bfloat16, the share of identical
responses, and the mean absolute change of the name margin (nats); then the wall time
of the bfloat16 sweep per generation. Run it on an idle machine::

    python benchmarks/bf16_ablation.py --run docs/real_models/smollm2-nolima \\
        --trials runs/real/smollm2-135m-nolima-v1/trials/eval_onehop_1000.jsonl
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    import pandas as pd

    import locos_tl as lt
    from locos_tl.experiments.protocol.common import _load, rankings_for_ablation
    from locos_tl.experiments.protocol.stages import load_rankings
    from locos_tl.experiments.run_table import score_records
    from locos_tl.runs.records import read_records

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-nolima-v1")
    ap.add_argument("--run", default="docs/real_models/smollm2-nolima",
                    help="a published run: detect/, means.safetensors, ablate/")
    ap.add_argument("--trials", required=True, help="the run's evaluation trials")
    ap.add_argument("--question", default="onehop_1000", help="the ablate/ sub-folder")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--methods", default="locos,wu,dla")
    ap.add_argument("--n", type=int, default=60, help="the first N trials")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--out", default="runs/bf16_ablation")
    args = ap.parse_args()

    run = Path(args.run)
    trials = _load(Path(args.trials))[: args.n]
    sets = rankings_for_ablation(load_rankings(run), args.methods)
    means = lt.AblationMeans.load(run / "means.safetensors")
    model = lt.load_model(args.model, device="cpu", dtype="bfloat16")
    t0 = time.perf_counter()
    df = lt.ablation_sweep(model, trials, sets, k=[args.k], mode="query_mean", means=means,
                           seeds=(0, 1, 2), bottom="locos", scorer="nolima",
                           max_new_tokens=args.max_new_tokens, out_dir=args.out)
    seconds = time.perf_counter() - t0
    published = run / "ablate" / args.question
    fp32, bf16 = read_records(published), read_records(args.out)
    jobs = json.loads((Path(args.out) / "jobs.json").read_text())
    # NoLiMa's "contains" per (head set, trial), as the sweep scores it
    hit = {name: score_records(d, trials, "nolima").query("metric == 'contains'")
           .set_index(["heads_key", "trial"])["value"]
           for name, d in (("fp32", published), ("bf16", args.out))}
    rows = []
    for cell in df[df["metric"] == "contains"].itertuples():
        key = next(j["heads_key"] for j in jobs["jobs"] if j["method"] == cell.method
                   and j["k"] == cell.k and j["seed"] == cell.seed)
        pairs = [(fp32[i], r) for i, r in bf16.items()
                 if r["heads_key"] == key and i in fp32]
        same = sum(a["generated"] == b["generated"] for a, b in pairs)
        dm = [abs(a["name_margin"] - b["name_margin"]) for a, b in pairs
              if a.get("name_margin") is not None and b.get("name_margin") is not None]
        both = [(key, b["trial"]) for _, b in pairs]
        rows.append({"method": cell.method, "k": cell.k, "seed": cell.seed,
                     "n": len(pairs), "contains fp32": hit["fp32"].loc[both].mean(),
                     "contains bf16": hit["bf16"].loc[both].mean(),
                     "same tokens": same / max(len(pairs), 1),
                     "mean |margin change| (nats)": sum(dm) / max(len(dm), 1)})
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))  # noqa: T201
    n_gen = len(rows) * len(trials)  # a rerun reuses finished generations: time a fresh --out
    print(f"bfloat16 sweep: {seconds:.1f} s for {n_gen} generations, "  # noqa: T201
          f"{seconds / n_gen:.2f} s each")
    table.to_csv(Path(args.out) / "comparison.csv", index=False)


if __name__ == "__main__":
    main()
