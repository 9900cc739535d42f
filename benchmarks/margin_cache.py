"""The name margin of an ablation sweep, from a second full forward or from the decoding's
prefill cache (``greedy_decode(..., score_continuations=...)``).

On a real model (default ``smollm2-135m-instruct``), distractor trials of ``--length``
tokens: per generation, the wall time of greedy decoding plus :func:`name_margin` (a
batched forward of prompt + each name) against greedy decoding that scores the names
from a copy of its own prefill cache, and the largest difference of the margins (nats).
Prints one table::

    python benchmarks/margin_cache.py --n 8
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    import pandas as pd
    import torch

    import locos_tl as lt
    from locos_tl.engine.decode import greedy_decode
    from locos_tl.experiments.margin import (
        candidate_token_ids,
        margin_of_logprobs,
        name_margin,
    )

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--data-dir", default=None,
                    help="folder with haystack/*.txt (default: the books shipped with locos_tl)")
    ap.add_argument("--n", type=int, default=8, help="trials")
    ap.add_argument("--length", type=int, default=1000)
    ap.add_argument("--distractors", type=int, default=1)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--template", choices=("chat", "completion"), default="chat")
    args = ap.parse_args()

    model = lt.load_model(args.model, device="cpu", dtype=args.dtype)
    from locos_tl.data.packaged import resolve_data_dir

    books, _ = resolve_data_dir(args.data_dir)
    hay = lt.load_haystacks([books / "mohicans_part1.txt"])
    items = lt.expand_needle_set(lt.load_needle_set("everyday"), ["onehop"])
    trials = lt.build_nolima_trials(model.tokenizer, items, hay, lengths=[args.length],
                                    depths=[25, 75], num_examples=args.n, seed=0,
                                    chat_template=args.template == "chat",
                                    distractors=args.distractors)
    greedy_decode(model, trials[0].tokens, max_new_tokens=2)  # warm-up
    rows = []
    for t in trials:
        t0 = time.perf_counter()
        a = greedy_decode(model, t.tokens, max_new_tokens=16)
        full = name_margin(model, t)["name_margin"]
        t1 = time.perf_counter()
        b = greedy_decode(model, t.tokens, max_new_tokens=16,
                          score_continuations=candidate_token_ids(model.tokenizer, t))
        cached = margin_of_logprobs(t, b.continuation_logprobs)["name_margin"]
        t2 = time.perf_counter()
        assert a.generated == b.generated
        rows.append({"full_forward_s": t1 - t0, "prefill_cache_s": t2 - t1,
                     "margin_diff": abs(full - cached)})
    df = pd.DataFrame(rows)
    print(f"{args.model}, {len(trials)} trials of {args.length} tokens, "  # noqa: T201
          f"{args.distractors} distractor(s), {args.dtype}, {torch.get_num_threads()} threads")
    print(pd.DataFrame({  # noqa: T201
        "per generation": ["decode + full-forward margin", "decode, margin from its cache"],
        "mean s": [df.full_forward_s.mean(), df.prefill_cache_s.mean()],
    }).to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    print(f"speed-up {df.full_forward_s.sum() / df.prefill_cache_s.sum():.2f}x; "  # noqa: T201
          f"largest margin difference {df.margin_diff.max():.2e} nats")


if __name__ == "__main__":
    main()
