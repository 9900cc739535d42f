"""Generate published ablation cells again and compare them with the published answers
token for token (docs/real_models.md, "Reproduce").

Used before a run goes on on another machine from ``--resume-from``: the calibrated
query means, recalibrated there, differ in their last bits, so this checks whether the
answers depend on it. The cells are named ``method:k[:seed]`` as in the published
``jobs.json`` (a method's top-k and a random seed's heads do not depend on the trials);
the baseline is always generated too. Exit code 1 when an answer differs.

Usage::

    python experiments/recheck_cells.py --model smollm2-135m-instruct \\
        --run runs/real/smollm2 --published docs/real_models/smollm2 \\
        --trials direct_1000 --cells locos:5 random:5:0 --workers 2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--run", required=True, type=Path,
                    help="run directory with means.safetensors and trials/")
    ap.add_argument("--published", required=True, type=Path)
    ap.add_argument("--trials", required=True, help="question_length, e.g. direct_1000")
    ap.add_argument("--cells", nargs="+", required=True, help="method:k[:seed]")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args(argv)

    import locos_tl as lt

    jobs = [j for f in sorted((args.published / "ablate").glob("*/jobs.json"))
            for j in json.loads(f.read_text())["jobs"]]
    head_sets = {}
    for cell in args.cells:
        method, k, *seed = cell.split(":")
        match = [j["heads"] for j in jobs if (j["method"], j["k"], j["seed"])
                 == (method, int(k), int(seed[0]) if seed else 0)]
        if not match:
            raise SystemExit(f"{cell}: no published jobs.json names this cell")
        head_sets[cell.replace(":", "_")] = [tuple(h) for h in match[0]]
    published = {}
    with open(args.published / "ablate" / args.trials / "trials.jsonl") as f:
        for line in f:
            rec = json.loads(line)
            published[rec["trial_id"]] = rec["generated"]
    model = lt.load_model(args.model)
    means = lt.AblationMeans.load(args.run / "means.safetensors")
    trials = lt.load_trials(args.run / "trials" / f"eval_{args.trials}.jsonl")
    scratch = args.run / "recheck" / args.trials
    lt.ablation_sweep(model, trials, head_sets, k=sorted({len(h) for h in head_sets.values()}),
                means=means, random=False, bottom=None, scorer="nolima", out_dir=scratch,
                max_new_tokens=args.max_new_tokens, workers=args.workers)
    same = differ = 0
    with open(scratch / "trials.jsonl") as f:
        for line in f:
            rec = json.loads(line)
            old = published.get(rec["trial_id"])
            if old is None:
                raise SystemExit(f"{rec['trial_id']}: not among the published answers")
            if old == rec["generated"]:
                same += 1
            else:
                differ += 1
                print(f"differs: {rec['trial_id']}: {rec['response']!r}")  # noqa: T201
    print(f"{args.trials}: {same} identical, {differ} different")  # noqa: T201
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
