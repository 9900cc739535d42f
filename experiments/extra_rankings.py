"""Attribution patching and QRHead in a published protocol run: both rankings computed
on the run's detection trials, then ablated (query-mean, the run's means) at one k on
its 1000-token evaluation trials beside a fresh baseline, so the README's tables carry a
row for every ranking, with paired tests of LOCOS against each and of each against
random heads (``paired_k{k}.csv``). The baseline must equal the published one (same
greedy answers); the script says whether it does. Resumable (``--out``)::

    python experiments/extra_rankings.py --run docs/real_models/smollm2 --k 10 \\
        --publish docs/real_models/smollm2
"""

from __future__ import annotations

import argparse
from pathlib import Path

#: the rankings this script adds to a published run
NEW = ("atp", "qrhead")


def main() -> None:
    import pandas as pd

    import locos_tl as lt
    from locos_tl.engine.ablation import AblationMeans
    from locos_tl.trials import load_trials

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="docs/real_models/smollm2")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--questions", default="direct,onehop")
    ap.add_argument("--out", default="runs/extra_rankings")
    ap.add_argument("--publish", default=None, help="the run directory to add the results to")
    args = ap.parse_args()

    run, out = Path(args.run), Path(args.out)
    from published_trials import rebuild_trials
    from published_trials import run_args as recorded

    run_args = recorded(run)
    tdir = rebuild_trials(run, out)
    model = lt.load_model(run_args["model"], device="cpu")
    detect = load_trials(tdir / "detect_onehop.jsonl")
    n_new = int(run_args.get("max_new_tokens", 16))
    scores = lt.score_methods(model, detect, methods=list(NEW),
                              out_dir=out / "detect", max_new_tokens=n_new)
    means = AblationMeans.load(run / "means.safetensors")
    rows, tests = [], []
    for q in args.questions.split(","):
        trials = load_trials(tdir / f"eval_{q}_1000.jsonl")
        df = lt.ablation_sweep(model, trials, scores, k=[args.k], mode="query_mean",
                               means=means, random=False, bottom=None,
                               max_new_tokens=int(run_args.get("eval_max_new_tokens", 16)),
                               out_dir=out / "ablate" / f"{q}_1000", ci=0.95)
        df.insert(0, "question", q)
        rows.append(df)
        published = pd.read_csv(run / "ablate" / f"{q}_1000" / "evaluation_ci.csv")
        pub = published[(published["method"] == "baseline")
                        & (published["metric"] == "contains")]["value"].iloc[0]
        new = df[(df["method"] == "baseline") & (df["metric"] == "contains")]["value"].iloc[0]
        print(f"{q}: baseline contains {new:.3f}, published {pub:.3f}"  # noqa: T201
              f" ({'same' if abs(new - pub) < 1e-12 else 'DIFFERENT'})")
        tests.append(_paired(run / "ablate" / f"{q}_1000", out / "ablate" / f"{q}_1000",
                             trials, args.k).assign(question=q))
    table = pd.concat(rows, ignore_index=True)
    paired = pd.concat(tests, ignore_index=True)
    print(table[table["metric"] == "contains"].to_string(index=False))  # noqa: T201
    print(paired.to_string(index=False, float_format=lambda v: f"{v:.3g}"))  # noqa: T201
    if args.publish:
        dest = Path(args.publish)
        for m, hs in scores.items():
            hs.save(dest / "heads" / m)
        (dest / "extra_rankings").mkdir(parents=True, exist_ok=True)
        table.to_csv(dest / "extra_rankings" / f"ablation_k{args.k}.csv", index=False)
        paired.to_csv(dest / "extra_rankings" / f"paired_k{args.k}.csv", index=False)


#: (a, b) pairs tested trial by trial: LOCOS against each new ranking, each against random
PAIRS = (*(("locos", m) for m in NEW), *((m, "random") for m in NEW))


def _paired(published: Path, new: Path, trials: list, k: int):
    """McNemar and Wilcoxon (:func:`locos_tl.paired_tests`) of :data:`PAIRS` at ``k``, on
    the published run's records (LOCOS, random) joined with this script's (AtP, QRHead)
    over the same trials."""
    import pandas as pd

    import locos_tl as lt
    from locos_tl.experiments.run_table import load_ablation_sweep

    pub = load_ablation_sweep(published, trials, per_trial=True)
    ours = load_ablation_sweep(new, trials, per_trial=True)
    # one record per cell: the new rankings from this script only (paired_tests refuses
    # a record held twice, as a run that already has them would give)
    recs = pd.concat([pub[~pub["method"].isin(NEW)], ours[ours["method"].isin(NEW)]],
                     ignore_index=True)
    return pd.concat([lt.paired_tests(recs, a, b, k=k) for a, b in PAIRS], ignore_index=True)


if __name__ == "__main__":
    main()
