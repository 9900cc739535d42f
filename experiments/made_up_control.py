"""Does the elicited hop come from pretrained knowledge? The made-up-word control.

A ``made_up`` trial asks "Which character is a florp?": a link no model can know. Two
needles (target and one distractor) sit in 1000 tokens of *Mohicans*; an answer that
names the target more often than the distractor would mean the model picks a needle
by something other than the link. This script runs ``--n`` such trials (the protocol's
evaluation names, depths and seed; resumable under ``--out``) on each model and prints,
per model: how often the answer names the target and the distractor, an exact sign
test among the answers that name exactly one of them, and Wilcoxon's signed-rank test
on the teacher-forced name margin (log P(target) - log P(distractor), nats)::

    python experiments/made_up_control.py --n 150
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    import pandas as pd
    from scipy.stats import binomtest, wilcoxon

    import locos_tl as lt
    from locos_tl.experiments.elicit_targets import answer_rates, cell_trials

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2-135m-nolima,smollm2-135m-instruct")
    ap.add_argument("--data-dir", default=None,
                    help="folder with haystack/*.txt (default: the books shipped with locos_tl)")
    ap.add_argument("--n", type=int, default=150, help="trials per model")
    ap.add_argument("--out", default="runs/made_up_control")
    ap.add_argument("--csv", default=None, help="also write the table here")
    args = ap.parse_args()

    from locos_tl.data.packaged import resolve_data_dir

    books, _ = resolve_data_dir(args.data_dir)
    hay = lt.load_haystacks([books / "mohicans_part1.txt", books / "mohicans_part2.txt"])
    entries = lt.load_needle_set("everyday")
    rows = []
    for name in args.models.split(","):
        model = lt.load_model(name, device="cpu")
        trials = cell_trials(model.tokenizer, entries, hay, question="made_up", length=1000,
                             distractors=1, n=args.n)
        out = Path(args.out) / name
        rates = answer_rates(model, trials, out)
        by_id = {t.trial_id: t for t in trials}
        target = distractor = 0
        margins = []
        for line in (out / "trials.jsonl").read_text().splitlines():
            r = json.loads(line)
            t = by_id[r["trial"]]
            text = r["response"].lower()
            has_t = t.answer.lower() in text
            has_d = any(d.lower() in text for d in t.meta["distractor_names"])
            target += has_t and not has_d
            distractor += has_d and not has_t
            margins.append(r["name_margin"])
        sign = binomtest(target, target + distractor, 0.5).pvalue if target + distractor else 1.0
        rows.append({"model": name, "n": rates["n"], "target": rates["target"],
                     "distractor": rates["distractor"], "only target": target,
                     "only distractor": distractor, "sign test p": sign,
                     "margin > 0": sum(m > 0 for m in margins) / len(margins),
                     "mean margin (nats)": sum(margins) / len(margins),
                     "Wilcoxon p": float(wilcoxon(margins).pvalue)})
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))  # noqa: T201
    if args.csv:
        table.to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
