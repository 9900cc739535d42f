"""The ablation grid of a protocol run over more head counts: each ranking's top k heads
query-mean ablated (the run's means, greedy, the run's decoding budget) at every k of
``--ks``, beside 3 seeds of k random heads and LOCOS's bottom k, on the run's
evaluation trials. Paired tests at each k: every ranking and the bottom-k control
against random heads, and LOCOS against every other ranking (McNemar on ``contains``,
Wilcoxon on the teacher-forced name margin; :func:`locos_tl.paired_tests`).

``--run`` is a ``locos reproduce`` directory that holds its trials, rankings
(``detect/``) and means (``runs/real/...``). The run's own generations (its baseline and
its k) are copied first and reused, so the baseline is the published one. Resumable
(``--out``); ``--publish`` copies every generation record beside the tables, and
``--resume-from`` starts from those records, so a clone rebuilds the published tables
without generating. ``--more-ks`` adds head counts at which only ``--more-methods`` and the
controls run, for once every ranking is at the floor. Writes ``ablation.csv`` (cells
with 95 % bootstrap intervals), ``paired.csv`` (tests) and ``k_sweep.{html,png}``
(contains against k)::

    python experiments/k_sweep.py --run runs/real/gemma-nolima-hop --ks 1,5,10 \\
        --methods locos,dla,wu,atp,qrhead \\
        --publish docs/real_models/gemma3-hop/protocol/k_sweep
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
    from locos_tl.experiments.protocol.common import rankings_for_ablation
    from locos_tl.experiments.protocol.stages import load_rankings
    from locos_tl.trials import load_trials

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="a locos reproduce run directory")
    ap.add_argument("--ks", default="1,5,10,20")
    ap.add_argument("--methods", default="locos,dla,wu,attention_spatial",
                    help="rankings of the run (detect/) to ablate")
    ap.add_argument("--more-ks", default="",
                    help="further k at which only --more-methods and the controls run")
    ap.add_argument("--more-methods", default="locos",
                    help="rankings ablated at --more-ks (e.g. once every ranking is at 0)")
    ap.add_argument("--seeds", default="0,1,2", help="random-heads seeds")
    ap.add_argument("--question", default="onehop")
    ap.add_argument("--length", type=int, default=1000)
    ap.add_argument("--out", default="runs/k_sweep")
    ap.add_argument("--publish", default=None,
                    help="copy the tables, the figure and the records (ablate/) here")
    ap.add_argument("--resume-from", default=None,
                    help="a published sweep (its ablate/ records) to start --out from")
    args = ap.parse_args()

    run, out = Path(args.run), Path(args.out)
    cell = f"{args.question}_{args.length}"
    run_args = json.loads((run / "args.json").read_text())
    rankings = rankings_for_ablation(load_rankings(run), args.methods)
    methods = list(rankings)
    # reuse the published sweep's generations, or the run's (baseline, its k)
    start_records(out / "ablate",
                  Path(args.resume_from) / "ablate" if args.resume_from else run / "ablate" / cell)
    means = AblationMeans.load(run / "means.safetensors")
    trials = load_trials(run / "trials" / f"eval_{cell}.jsonl")
    ks = [int(k) for k in args.ks.split(",")]
    model = lt.load_model(run_args["model"], device="cpu")
    more_ks = [int(k) for k in args.more_ks.split(",") if k]
    more = {m: rankings[m] for m in args.more_methods.split(",")} if more_ks else {}
    seeds = [int(s) for s in args.seeds.split(",")]

    def sweep(heads: dict, at: list[int]) -> pd.DataFrame:
        """Every ranking of ``heads`` at each k of ``at``, with the controls."""
        return lt.ablation_sweep(
            model, trials, heads, k=at, mode="query_mean", means=means, seeds=seeds,
            random=True, bottom="locos", out_dir=out / "ablate", ci=0.95,
            max_new_tokens=int(run_args.get("eval_max_new_tokens", 16)))

    t0 = time.perf_counter()
    table = sweep(rankings, ks)
    if more:
        extra = sweep(more, more_ks)
        table = pd.concat([table, extra[extra["method"] != "baseline"]], ignore_index=True)
    records = lt.load_ablation_sweep(out / "ablate", trials, per_trial=True)
    paired = pd.concat([lt.paired_tests(records, a, b, k=k)
                        for group, group_ks in ((methods, ks), (list(more), more_ks))
                        for k in group_ks for a, b in _pairs(group)], ignore_index=True)
    print(table[table["metric"] == "contains"].to_string(  # noqa: T201
        index=False, float_format=lambda x: f"{x:.3f}"))
    print(paired[["method", "against", "k", "contains", "contains_against",  # noqa: T201
                  "p_mcnemar", "name_margin", "name_margin_against", "p_wilcoxon"]]
          .to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    print(f"{len(trials)} trials, {time.perf_counter() - t0:.0f} s")  # noqa: T201
    fig = lt.plot.ablation_curves(table, metrics=["contains"],
                                  title=f"{run_args['model']}: {cell}, names the target")
    for dest in [out, *([Path(args.publish)] if args.publish else [])]:
        dest.mkdir(parents=True, exist_ok=True)
        table.to_csv(dest / "ablation.csv", index=False)
        paired.to_csv(dest / "paired.csv", index=False)
    if args.publish:  # every generation, so a clone rebuilds the tables (--resume-from)
        publish_records(out / "ablate", Path(args.publish) / "ablate")
        from figures import save_figure

        save_figure(fig, Path(args.publish) / "k_sweep", fmt="html")


def _pairs(methods: list[str]) -> list[tuple[str, str]]:
    """Each ranking and the bottom-k control against random heads, LOCOS against each."""
    pairs = [(m, "random") for m in [*methods, "locos_bottom"]]
    return pairs + [("locos", m) for m in methods if m != "locos"]


if __name__ == "__main__":
    main()
