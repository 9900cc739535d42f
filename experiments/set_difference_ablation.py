"""The direct test of a ranking's extra information: ablate the heads in A's top k that
are not in B's top k (``A-B@k``), the heads in B's top k not in A's (``B-A@k``), and as
many random heads, on a protocol run's evaluation trials (query-mean ablation with the
run's means, greedy, the run's decoding budget). Paired tests of each difference set
against the other and against random heads of the same size: McNemar on ``contains``,
Wilcoxon on the teacher-forced name margin (:func:`locos_tl.paired_tests`).

``--run`` is a ``locos reproduce`` directory that holds its trials, rankings and means
(``runs/real/...``). Resumable (``--out``); prints the table and writes
``set_difference.csv`` (cells) and ``paired.csv`` (tests). ``--publish`` copies them
and every generation record (``ablate/``); ``--resume-from`` starts ``--out`` from
those records, so a clone rebuilds the published tables without generating::

    python experiments/set_difference_ablation.py --run runs/real/smollm2-nolima-hop \\
        --pairs locos:dla,locos:attention_spatial --ks 5,10,20 \\
        --publish docs/real_models/smollm2-hop/protocol/set_difference
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    import pandas as pd
    from sweep_records import publish_records, start_records

    import locos_tl as lt
    from locos_tl.engine.ablation import AblationMeans
    from locos_tl.experiments.protocol.stages import load_rankings
    from locos_tl.experiments.set_difference import difference_name, difference_sets
    from locos_tl.trials import load_trials

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="a locos reproduce run directory")
    ap.add_argument("--pairs", default="locos:dla,locos:attention_spatial",
                    help="A:B,... ranking pairs")
    ap.add_argument("--ks", default="5,10,20")
    ap.add_argument("--question", default="onehop")
    ap.add_argument("--length", type=int, default=1000)
    ap.add_argument("--seeds", default="0", help="random-heads seeds of each size")
    ap.add_argument("--n", type=int, default=None, help="first N evaluation trials")
    ap.add_argument("--out", default="runs/set_difference")
    ap.add_argument("--publish", default=None,
                    help="copy the two CSV files and the records (ablate/) here")
    ap.add_argument("--resume-from", default=None,
                    help="a published set difference (its ablate/ records) to start --out from")
    args = ap.parse_args()

    run, out = Path(args.run), Path(args.out)
    start_records(out / "ablate", Path(args.resume_from) / "ablate" if args.resume_from else None)
    run_args = json.loads((run / "args.json").read_text())
    rankings = load_rankings(run)
    means = AblationMeans.load(run / "means.safetensors")
    trials = load_trials(run / "trials" / f"eval_{args.question}_{args.length}.jsonl")
    trials = trials[: args.n]
    ks = [int(k) for k in args.ks.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    model = lt.load_model(run_args["model"], device="cpu")
    cells, sets, partner = [], {}, {}
    t0 = time.perf_counter()
    for pair in args.pairs.split(","):
        a, b = pair.split(":")
        diffs = difference_sets(rankings, (a, b), ks)
        sets.update(diffs)
        for k in ks:
            ab, ba = difference_name(a, b, k), difference_name(b, a, k)
            partner[ab], partner[ba] = ba, ab  # each set's opposite direction
            group = {n: diffs[n] for n in (ab, ba) if n in diffs}
            if not group:  # identical top-k sets: nothing to ablate
                continue
            size = len(next(iter(group.values())))
            df = lt.ablation_sweep(
                model, trials, group, k=[size], mode="query_mean", means=means,
                seeds=seeds, random=True, bottom=None, out_dir=out / "ablate",
                max_new_tokens=int(run_args.get("eval_max_new_tokens", 16)), ci=0.95)
            cells.append(df.assign(pair=pair, top_k=k))
    table = pd.concat(cells, ignore_index=True)
    table["heads"] = table["method"].map(
        lambda m: " ".join(f"L{layer}H{head}" for layer, head in sets.get(m, [])))
    records = lt.load_ablation_sweep(out / "ablate", trials, per_trial=True)
    tests = []
    for name, heads in sets.items():
        size = len(heads)
        other = partner[name]
        for against in ((other,) if name < other else ()) + ("random",):
            if against in set(records["method"]):
                tests.append(lt.paired_tests(records, name, against, k=size))
    paired = pd.concat(tests, ignore_index=True)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "set_difference.csv", index=False)
    paired.to_csv(out / "paired.csv", index=False)
    show = table[table["metric"] == "contains"][
        ["pair", "top_k", "method", "k", "seed", "value", "ci_low", "ci_high", "heads"]]
    print(show.to_string(index=False, float_format=lambda x: f"{x:.3f}"))  # noqa: T201
    print(paired[["method", "against", "k", "contains", "contains_against",  # noqa: T201
                  "p_mcnemar", "name_margin", "name_margin_against", "p_wilcoxon"]]
          .to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    print(f"{len(trials)} trials, {time.perf_counter() - t0:.0f} s")  # noqa: T201
    if args.publish:
        dest = Path(args.publish)
        dest.mkdir(parents=True, exist_ok=True)
        table.to_csv(dest / "set_difference.csv", index=False)
        paired.to_csv(dest / "paired.csv", index=False)
        publish_records(out / "ablate", dest / "ablate")


if __name__ == "__main__":
    main()
