"""Accuracy under head-guided KV-cache compression at several context lengths.

For each prompt length, on a shipped organism (default ``retrieval-long``, book filler):

1. scores heads with LOCOS, the Wu copy score and HeadKV's retrieval-reasoning score
   (:func:`locos_tl.score_trials`) on ``--n-detect`` trials per task (seed 31);
2. sweeps the retained fraction of the context KV cache under each ranking, plus the
   uniform and random controls (:func:`locos_tl.experiments.compress.compression_sweep`, greedy
   allocation, per-query-head budgets, HeadKV's published allocation for ``headkv``) on
   ``--n-eval`` fresh trials per task (seed 32);
3. prints accuracy per ranking x fraction x task, and the LOCOS - Wu gap.

Writes ``compression_<T>.csv`` (the sweep's tidy frame) per length under ``--out``;
a length already written is read back (resumable).

Usage: ``python experiments/compression_by_length.py [--lengths 1024,2048,4088]
[--n-eval 40] [--n-detect 16] [--out runs/compression_by_length]``
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def sweep_at(model, n_tokens: int, n_detect: int, n_eval: int, book, fractions) -> pd.DataFrame:
    import locos_tl as lt
    from locos_tl.experiments.compress import compression_sweep
    from locos_tl.organisms import make_trials

    detect = [t for task in ("literal", "nonliteral")
              for t in make_trials(task, n_detect, n_tokens=n_tokens, book=book, seed=31)]
    scores = lt.score_methods(model, detect, methods=["locos", "wu", "headkv"],
                              max_new_tokens=4, progress=False)
    evals = [t for task in ("literal", "nonliteral")
             for t in make_trials(task, n_eval, n_tokens=n_tokens, book=book, seed=32)]
    rankings = {m: scores[m] for m in ("locos", "wu", "headkv")}
    df = compression_sweep(model, evals, rankings, fractions, unit="query_head",
                           include=("uniform", "random"), seed=0, progress=True)
    df["n_tokens"] = n_tokens
    return df


def main(argv: list[str] | None = None) -> int:
    import locos_tl as lt
    from locos_tl.organisms import LONG_ORGANISM, default_book_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=LONG_ORGANISM)
    ap.add_argument("--lengths", default="1024,2048,4088",
                    help="prompt lengths; at most n_ctx minus the decoded tokens (4088 for 4096)")
    ap.add_argument("--fractions", default=",".join(map(str, FRACTIONS)))
    ap.add_argument("--n-eval", type=int, default=40)
    ap.add_argument("--n-detect", type=int, default=16)
    ap.add_argument("--synthetic", action="store_true", help="synthetic filler, not books")
    ap.add_argument("--out", default="runs/compression_by_length")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    book = None if a.synthetic or not default_book_dir().is_dir() else default_book_dir()
    fractions = tuple(float(f) for f in a.fractions.split(","))
    model = lt.load_model(a.model, device="cpu")
    frames = []
    for T in (int(x) for x in a.lengths.split(",")):
        path = out / f"compression_{T}.csv"
        if path.is_file():
            df = pd.read_csv(path, dtype={"trial": str})
        else:
            df = sweep_at(model, T, a.n_detect, a.n_eval, book, fractions)
            df.to_csv(path, index=False)
        frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    acc = df.pivot_table(index=["n_tokens", "task", "ranking"], columns="fraction",
                         values="correct")
    print(f"accuracy ({a.n_eval} trials per task and length; "  # noqa: T201
          f"{'synthetic' if book is None else 'book'} filler; per-query-head budgets)")
    print(acc.round(2).to_string())  # noqa: T201
    gap = (acc.xs("locos", level="ranking") - acc.xs("wu", level="ranking")).round(2)
    print("\nLOCOS - Wu")  # noqa: T201
    print(gap.to_string())  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
