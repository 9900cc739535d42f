"""Where the elicited hop is computed, on ``smollm2-135m-nolima`` against its base.

1. Cross-model MLP activation patching (:func:`locos_tl.experiments.cross_model.mlp_patching`):
   the elicited model's MLP writes patched into SmolLM2 at the question's tokens, the
   needle's, or both; every layer at once on ``--n`` trials, each layer alone on
   ``--n-each``.
2. Attention-score attribution (:func:`locos_tl.experiments.score_attribution.score_attribution`):
   the attention logit of LOCOS's top heads (of the elicited model's detection) from the
   answer position to the needle, summed over the needle, decomposed into upstream
   components on the query and the key side; on both models, so the difference shows
   what the changed MLPs add.

Trials: the published run's held-out ``onehop`` evaluation trials (1000 tokens, one
distractor), rebuilt with ``locos reproduce --stages trials``. Writes CSVs and figures
into ``--publish``::

    python experiments/hop_locus.py --publish docs/real_models/smollm2-nolima/hop_locus
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    import pandas as pd

    import locos_tl as lt
    from locos_tl.experiments.cross_model import mlp_patching, summarize_mlp_patching
    from locos_tl.experiments.score_attribution import score_attribution
    from locos_tl.heads import HeadScores
    from locos_tl.plot.hop import mlp_patching_curves, score_attribution_bars
    from locos_tl.trials import load_trials

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="docs/real_models/smollm2-nolima")
    ap.add_argument("--base", default="smollm2-135m-instruct")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--n-each", type=int, default=10)
    ap.add_argument("--n-attribution", type=int, default=20)
    ap.add_argument("--k", type=int, default=5, help="LOCOS's top k heads to attribute")
    ap.add_argument("--out", default="runs/hop_locus")
    ap.add_argument("--publish", default=None)
    args = ap.parse_args()

    run, out = Path(args.run), Path(args.out)
    from figures import save_figure
    from published_trials import rebuild_trials, run_args

    model_name = run_args(run)["model"]
    tfile = rebuild_trials(run, out) / "eval_onehop_1000.jsonl"
    trials = load_trials(tfile)
    base, donor = lt.load_model(args.base, device="cpu"), lt.load_model(model_name, device="cpu")
    dest = Path(args.publish or out)
    dest.mkdir(parents=True, exist_ok=True)

    rows = mlp_patching(base, donor, trials[:args.n], layers="all")
    each = mlp_patching(base, donor, trials[:args.n_each], layers="each")
    rows.to_csv(dest / "mlp_patching_all_layers.csv", index=False)
    each.to_csv(dest / "mlp_patching_each_layer.csv", index=False)
    summary = pd.concat([summarize_mlp_patching(rows),
                         summarize_mlp_patching(each[each["layer"] != "all"])])
    summary.to_csv(dest / "mlp_patching_summary.csv", index=False)
    print(summary.to_string(index=False, float_format=lambda v: f"{v:.2f}"))  # noqa: T201
    save_figure(mlp_patching_curves(summary), dest / "mlp_patching")
    save_figure(mlp_patching_curves(summary, metric="target_logprob"),
                dest / "mlp_patching_target")

    heads = HeadScores.load(run / "heads" / "locos").ranked()[:args.k]
    frames = []
    for name, model in (("elicited", donor), ("base", base)):
        df = score_attribution(model, trials[:args.n_attribution], heads, keys="sum")
        df.insert(0, "model", name)
        frames.append(df)
    attr = pd.concat(frames, ignore_index=True)
    attr.to_csv(dest / "score_attribution.csv", index=False)
    mean = (attr.groupby(["model", "label", "side", "component"], sort=False)["contribution"]
            .mean().unstack("model"))
    mean["elicited_minus_base"] = mean["elicited"] - mean["base"]
    mean.reset_index().to_csv(dest / "score_attribution_mean.csv", index=False)
    top = mean.reindex(mean["elicited_minus_base"].abs().sort_values(ascending=False).index)
    print(top.head(15).to_string(float_format=lambda v: f"{v:.2f}"))  # noqa: T201
    print("largest |residual|:", float(attr["residual"].abs().max()))  # noqa: T201
    save_figure(score_attribution_bars(frames[0]), dest / "score_attribution")


if __name__ == "__main__":
    main()
