"""An elicited model against its base: retrieval beside distractor needles, and general
ability (:mod:`locos_tl.experiments.elicit_targets`).

For each model, on an evaluation needle set (``--needle-set``: ``hop_eval``, link kinds
never trained on, or ``everyday``; evaluation names; the Mohicans books, never trained
on; the chat template, or the completion form for a base model without one), greedy:
how often the answer names the target and a distractor, per cell (question, length,
distractors); then parametric and arithmetic controls ("contains",
and exact match) and perplexity on Mohicans part 1. A model is a registry name or an
``locos elicit`` run directory (its adapter is merged into ``RUN/merged`` first).
Resumable (``--out``); prints one table and writes ``targets.csv``::

    python experiments/elicited_targets.py --needle-set hop_eval \\
        --out runs/elicited_targets/hop_eval --publish docs/real_models/smollm2-nolima
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    import pandas as pd

    import locos_tl as lt
    from locos_tl.data.nolima import resolve_template
    from locos_tl.experiments.elicit_targets import CELLS, perplexity, targets_table
    from locos_tl.experiments.protocol.common import EVAL_SEED

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2-135m-nolima,smollm2-135m-instruct")
    ap.add_argument("--data-dir", default=None,
                    help="folder with haystack/*.txt (default: the books shipped with locos_tl)")
    ap.add_argument("--n", type=int, default=100,
                    help="trials of the 1000-token, one-distractor cells")
    ap.add_argument("--n-extra", type=int, default=50,
                    help="trials of the other cells (3 distractors, 2000 tokens, made-up)")
    ap.add_argument("--n-control", type=int, default=50)
    ap.add_argument("--needle-set", default="everyday",
                    help="evaluation needle set (hop_eval, everyday; never a training set)")
    ap.add_argument("--no-general", action="store_true",
                    help="skip the parametric, arithmetic and perplexity rows")
    ap.add_argument("--cells", default=None,
                    help="question:length:distractors,... (default: every cell)")
    ap.add_argument("--out", default="runs/elicited_targets")
    ap.add_argument("--publish", default=None, help="copy targets.csv here")
    args = ap.parse_args()

    from locos_tl.data.packaged import resolve_data_dir

    books, _ = resolve_data_dir(args.data_dir)
    hay = lt.load_haystacks([books / "mohicans_part1.txt", books / "mohicans_part2.txt"])
    entries = lt.load_needle_set(args.needle_set)
    cells = CELLS if args.cells is None else [
        (q, int(L), int(d)) for q, L, d in (c.split(":") for c in args.cells.split(","))]
    n = {c: args.n if (c[1], c[2]) == (1000, 1) and c[0] != "made_up" else args.n_extra
         for c in cells}
    frames = []
    for name in args.models.split(","):
        t0 = time.perf_counter()
        model = lt.load_model(checkpoint_dir(name), device="cpu")
        out = Path(args.out) / Path(name).name
        df = targets_table(model, entries, hay, n=n, out_dir=out)
        tok, n_ctx = model.tokenizer, int(model.cfg.n_ctx)
        general = () if args.no_general else (("parametric", lt.build_parametric_trials),
                                              ("arithmetic", lt.build_arithmetic_trials))
        for kind, build in general:
            # a base model without a chat template gets the plain control template
            trials = build(tok, n=args.n_control, seed=EVAL_SEED,
                           chat_template=resolve_template("auto", tok) == "chat",
                           n_ctx=n_ctx)
            ev = lt.ablation_sweep(model, trials, {}, k=[1], mode="query_zero",
                                   random=False, bottom=None, scorer="control",
                                   out_dir=out / f"control_{kind}", max_new_tokens=16,
                                   progress=False)
            base = ev[ev["method"] == "baseline"].set_index("metric")
            # "contains" (the gold answer anywhere in the response) is the control metric of
            # the protocol's DS(k); a chat model answers in sentences, so exact match is
            # near 0 for it and is kept only as a column
            df.loc[len(df)] = {"question": kind, "n": int(base["n_trials"].iloc[0]),
                               "target": float(base.loc["contains", "value"]),
                               "exact_match": float(base.loc["exact_match", "value"])}
        if not args.no_general:
            ppl = perplexity(model, hay[0].text)
            df.loc[len(df)] = {"question": "perplexity (Mohicans 1)", "target": ppl}
        df.insert(0, "model", Path(name).name)
        df.insert(1, "needle_set", args.needle_set)
        frames.append(df)
        print(f"{name}: {time.perf_counter() - t0:.0f} s")  # noqa: T201
    table = pd.concat(frames, ignore_index=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    old = Path(args.out) / "targets.csv"
    if old.exists():  # other models' rows of an earlier call stay
        prev = pd.read_csv(old)
        table = pd.concat([prev[~prev["model"].isin(table["model"])], table],
                          ignore_index=True)
    table.to_csv(Path(args.out) / "targets.csv", index=False)
    if args.publish:
        Path(args.publish).mkdir(parents=True, exist_ok=True)
        table.to_csv(Path(args.publish) / "targets.csv", index=False)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))  # noqa: T201


def checkpoint_dir(name: str) -> str:
    """A registry name as is; an elicit run directory merged into ``RUN/merged``."""
    run = Path(name)
    if not (run / "adapter" / "adapter_config.json").is_file():
        return name
    from locos_tl.models.elicited import save_merged
    from locos_tl.models.zoo import resolve_checkpoint

    base = json.loads((run / "elicit.json").read_text())["config"]["base"]
    return str(save_merged(run / "adapter", resolve_checkpoint(base), run / "merged"))


if __name__ == "__main__":
    main()
