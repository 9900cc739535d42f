"""What the greedy answers of ``experiments/elicited_targets.py`` name: the target, a
distractor, or neither needle's character, per link kind. Read from that run's stored
responses (nothing is generated); the trials are rebuilt with the model's tokenizer, as
the run built them. "Names" is the published rates' rule: ``contains`` and
``contains_distractor`` of :func:`locos_tl.experiments.task_metrics.score_nolima`.

Prints the table and the most frequent answers that name neither; writes
``answers.csv`` (one row per trial) and ``breakdown.csv`` (per cell and link kind)::

    python experiments/answer_breakdown.py --run runs/elicited_targets/hop_eval \\
        --model smollm2-hop --tokenizer smollm2-135m-nolima --needle-set hop_eval \\
        --publish docs/real_models/smollm2-hop/hop_eval/answers
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path


def main() -> None:
    import pandas as pd
    from transformers import AutoTokenizer

    import locos_tl as lt
    from locos_tl.data.packaged import resolve_data_dir
    from locos_tl.experiments.elicit_targets import cell_trials
    from locos_tl.experiments.task_metrics import score_nolima
    from locos_tl.models.zoo import resolve_checkpoint

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, type=Path,
                    help="the --out directory of experiments/elicited_targets.py")
    ap.add_argument("--model", required=True, help="the model's folder under --run")
    ap.add_argument("--tokenizer", required=True,
                    help="registry name or directory whose tokenizer built the trials")
    ap.add_argument("--needle-set", default="hop_eval")
    ap.add_argument("--cells", default="onehop:1000:1:200,direct:1000:1:200",
                    help="question:length:distractors:trials,...")
    ap.add_argument("--publish", type=Path, default=None)
    args = ap.parse_args()

    tok = AutoTokenizer.from_pretrained(resolve_checkpoint(args.tokenizer) or args.tokenizer)
    books, _ = resolve_data_dir(None)
    hay = lt.load_haystacks([books / "mohicans_part1.txt", books / "mohicans_part2.txt"])
    entries = lt.load_needle_set(args.needle_set)
    rows = []
    for cell in args.cells.split(","):
        question, length, k, n = cell.split(":")
        trials = cell_trials(tok, entries, hay, question=question, length=int(length),
                             distractors=int(k), n=int(n))
        answers: dict[str, tuple[str, dict[str, float]]] = {}

        def keep(response: str, trial, answers=answers) -> dict[str, float]:
            answers[trial.trial_id] = (response, score := score_nolima(response, trial))
            return score

        sub = args.run / args.model / f"{question}_{length}_d{k}"
        lt.load_ablation_sweep(sub, trials, scorer=keep)
        if len(answers) != len(trials):
            raise SystemExit(f"{sub} holds {len(answers)} of the {len(trials)} answers")
        for t in trials:
            r, score = answers[t.trial_id]
            target = score["contains"] == 1.0
            rival = score.get("contains_distractor") == 1.0
            rows.append({"question": question, "length": int(length), "distractors": int(k),
                         "kind": t.meta["reasoning_type"], "entry_id": t.meta["entry_id"],
                         "names": "target" if target else "distractor" if rival else "neither",
                         "response": r})
    df = pd.DataFrame(rows)
    cols = ["question", "length", "distractors", "kind"]
    table = (pd.crosstab([df[c] for c in cols], df["names"]).reset_index()
             .reindex(columns=[*cols, "target", "distractor", "neither"], fill_value=0))
    table["n"] = table[["target", "distractor", "neither"]].sum(axis=1)
    print(table.to_string(index=False))  # noqa: T201
    for question, g in df[df["names"] == "neither"].groupby("question"):
        common = Counter(g["response"].str.strip()).most_common(8)
        print(f"{question}, names neither ({len(g)}):", common)  # noqa: T201
    for dest in [args.run / args.model, *([args.publish] if args.publish else [])]:
        dest.mkdir(parents=True, exist_ok=True)
        df.to_csv(dest / "answers.csv", index=False)
        table.to_csv(dest / "breakdown.csv", index=False)


if __name__ == "__main__":
    main()
