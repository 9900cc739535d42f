"""The KL weight of ``locos elicit``, chosen on validation data only: for each run of the
search (the same recipe at several ``--kl-weight``), its validation rows (``onehop`` and
``direct`` on the validation entries; perplexity against the base on the validation book),
which rows the early-stopping rule may keep (perplexity within ``max_ppl_ratio``), and the
state it keeps. ``--reference`` adds a shipped elicited model whose run validated on the
training books' tails: its kept state's perplexity ratio on the validation book is
measured here (:func:`locos_tl.organisms.elicit_keep.keep_validation`, the same windows,
the BOS token the tokenizer puts before text first).

Writes ``search.csv`` (every validation row) and ``search.{html,png}`` (validation
``onehop`` target rate and perplexity ratio against step, one line a weight)::

    python experiments/kl_weight_search.py --runs runs/elicit/gemma-kl1 runs/elicit/gemma-kl3 \\
        --reference gemma3-270m-nolima-v1=runs/elicit/gemma-hop --val-book mohicans_part2 \\
        --publish docs/real_models/gemma3-hop/kl_search
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def run_rows(run: Path) -> list[dict]:
    """The validation rows of an elicit run, with its KL weight, early stopping's score
    of each row (:func:`locos_tl.organisms.elicit.validation_score`; ``None``: not
    eligible) and whether the run keeps it (the first best score, as training does)."""
    from locos_tl.organisms.elicit import ElicitConfig, validation_score

    cfg = json.loads((run / "elicit.json").read_text())["config"] \
        if (run / "elicit.json").exists() else _checkpoint_config(run)
    rule = ElicitConfig(max_ppl_ratio=cfg["max_ppl_ratio"])
    rows = [json.loads(line) for line in (run / "curve.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "onehop_target" in r]
    for r in rows:
        score = validation_score(r, rule)
        r.update(run=run.name, kl_weight=cfg["kl_weight"],
                 val_books=",".join(cfg.get("val_books", [])) or "training tails",
                 eligible=score is not None, score=score, kept=False)
    scored = [r for r in rows if r["score"] is not None]
    if scored:
        max(scored, key=lambda r: r["score"])["kept"] = True  # first of equal scores
    return rows


def _checkpoint_config(run: Path) -> dict:
    import torch

    return torch.load(run / "checkpoint.pt", weights_only=False)["config"]


def reference_ratio(name: str, run: Path, val_book: str) -> dict:
    """The shipped model ``name``'s perplexity ratio and KL to its base on ``val_book``'s
    validation windows, with its run's kept validation row."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from locos_tl.models.zoo import resolve_checkpoint
    from locos_tl.organisms.elicit import base_directory, book_file
    from locos_tl.organisms.elicit_keep import KeepData, book_tokens, keep_validation, leading_bos

    record = json.loads((run / "elicit.json").read_text())
    cfg = record["config"]
    base_dir = base_directory(cfg["base"])
    load = lambda d: AutoModelForCausalLM.from_pretrained(  # noqa: E731
        d, dtype=torch.float32).eval().requires_grad_(False)
    model, base = load(resolve_checkpoint(name)), load(base_dir)
    tok = AutoTokenizer.from_pretrained(base_dir)
    keep = KeepData(base=base, books=[], prompts=[], window=cfg["kl_window"],
                    val_books=book_tokens(tok, [book_file(val_book).read_text()]),
                    bos=leading_bos(tok))
    got = keep_validation(model, keep, autocast=cfg["bf16_autocast"])
    kept = record["validation"]
    return {"run": name, "kl_weight": cfg["kl_weight"], "val_books": val_book,
            "step": record["best_step"], "onehop_target": kept["onehop_target"],
            "onehop_distractor": kept["onehop_distractor"],
            "direct_target": kept["direct_target"], "kl_text": got["kl_text"],
            "ppl_ratio": got["ppl_ratio"], "eligible": got["ppl_ratio"] <= cfg["max_ppl_ratio"],
            "kept": True}


def main() -> None:
    import pandas as pd
    import plotly.express as px

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="+", type=Path, default=[], help="elicit run directories")
    ap.add_argument("--reference", action="append", default=[],
                    help="NAME=RUN: a shipped elicited model and its run directory")
    ap.add_argument("--val-book", default="mohicans_part2")
    ap.add_argument("--publish", type=Path, default=None)
    args = ap.parse_args()

    df = pd.DataFrame([r for run in args.runs for r in run_rows(run)])
    refs = []
    for spec in args.reference:
        name, run = spec.split("=", 1)
        refs.append(reference_ratio(name, Path(run), args.val_book))
    df = pd.concat([df, pd.DataFrame(refs)], ignore_index=True)
    cols = ["run", "kl_weight", "val_books", "step", "onehop_target", "onehop_distractor",
            "direct_target", "kl_text", "ppl_ratio", "eligible", "kept"]
    df = df[cols]
    print(df.to_string(index=False, float_format=lambda x: f"{x:.3f}"))  # noqa: T201
    if args.publish:
        from figures import save_figure

        args.publish.mkdir(parents=True, exist_ok=True)
        df.to_csv(args.publish / "search.csv", index=False)
        long = df[df["run"].isin([r.name for r in args.runs])].melt(
            id_vars=["run", "kl_weight", "step"], value_vars=["onehop_target", "ppl_ratio"])
        fig = px.line(long, x="step", y="value", color="kl_weight", facet_row="variable",
                      markers=True, title="KL weight search: validation entries and book")
        fig.update_yaxes(matches=None)
        save_figure(fig, args.publish / "search", fmt="html")


if __name__ == "__main__":
    main()
