"""Validation across link kinds: each model's greedy answers on ``hop_val`` (4 link kinds
in no other entry set), scored as ``locos elicit`` scores its validation entries
(:func:`locos_tl.organisms.elicit.validate`: ``contains`` on 8 new tokens, bf16
autocast as in training). The trials are built as training's validation trials
(:func:`locos_tl.organisms.elicit_data.validation_trials`: one distractor, the
training books as haystack, the entries' own names), so no evaluation entry, name or
book is read. It compares recipes (a KL weight, a rank) on a hop that must carry over to
new links, before any evaluation.

A model is a registry name or a ``locos elicit`` run directory (merged into
``RUN/merged`` first). Resumable: models already in ``--out`` are skipped::

    python experiments/cross_kind_validation.py \\
        --models gemma-3-270m,gemma3-270m-nolima-v1,runs/elicit/gemma-kl1 \\
        --out runs/cross_kind_validation/gemma.csv
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def main() -> None:
    import pandas as pd
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import locos_tl as lt
    from locos_tl.data.nolima import resolve_template
    from locos_tl.models.zoo import resolve_checkpoint
    from locos_tl.organisms.elicit import ElicitConfig, book_file, validate
    from locos_tl.organisms.elicit_data import validation_trials

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", required=True, help="registry names or run directories")
    ap.add_argument("--val-needle-set", default="hop_val")
    ap.add_argument("--n", type=int, default=48, help="trials per question type")
    ap.add_argument("--length", type=int, default=1000)
    ap.add_argument("--books", default=",".join(ElicitConfig.haystacks),
                    help="haystack books (the training books, as validation uses)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("runs/cross_kind_validation/rows.csv"))
    ap.add_argument("--publish", type=Path, default=None, help="copy the CSV here")
    args = ap.parse_args()

    from elicited_targets import checkpoint_dir

    entries = lt.load_needle_set(args.val_needle_set)
    hay = lt.load_haystacks([book_file(b) for b in args.books.split(",")])
    cfg = ElicitConfig(seed=args.seed)
    done = pd.read_csv(args.out) if args.out.exists() else pd.DataFrame(columns=["model"])
    rows = done.to_dict("records")
    for name in args.models.split(","):
        label = Path(name).name
        if label in set(done["model"]):
            continue
        t0 = time.perf_counter()
        path = checkpoint_dir(name)
        path = resolve_checkpoint(path) or path
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        template = resolve_template("auto", tok)
        trials = validation_trials(tok, entries, hay, n=args.n, length=args.length,
                                   question_types=("onehop", "direct"), seed=args.seed,
                                   template=template)
        row = validate(model, tok, trials, cfg, "cpu")
        rows.append({"model": label, "needle_set": args.val_needle_set, "template": template,
                     "n": args.n, **row, "seconds": round(time.perf_counter() - t0)})
        print(rows[-1], flush=True)  # noqa: T201
        args.out.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_csv(args.out, index=False)
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))  # noqa: T201
    if args.publish:
        args.publish.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.publish, index=False)


if __name__ == "__main__":
    main()
