"""Perplexity of an elicited model over its base's, on book windows with and without the
BOS token first. Gemma reads every text after ``<bos>``; without it the base's
perplexity is about 5 times higher, so a KL term or a validation measured on windows
without BOS looks at a distribution the model never meets (the recipe of
``gemma3-270m-nolima-v1``, ``locos elicit --no-text-bos``).

12 evenly spaced windows a book, float32, Hugging Face forward. Prints and writes
``perplexity_bos.csv``::

    python experiments/perplexity_bos.py --model gemma3-270m-nolima-v1 --base gemma-3-270m \\
        --out docs/real_models/gemma3-hop/perplexity_bos.csv
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path


def main() -> None:
    import pandas as pd
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from locos_tl.data.packaged import book_path
    from locos_tl.models.zoo import resolve_checkpoint
    from locos_tl.organisms.elicit import base_directory

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-270m-nolima-v1")
    ap.add_argument("--base", default="gemma-3-270m")
    ap.add_argument("--books", default="mohicans_part1,mohicans_part2,dracula_part1")
    ap.add_argument("--windows", type=int, default=12)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    base_dir = base_directory(args.base)
    tok = AutoTokenizer.from_pretrained(base_dir)
    load = lambda d: AutoModelForCausalLM.from_pretrained(  # noqa: E731
        d, dtype=torch.float32).eval().requires_grad_(False)
    models = {"model": load(resolve_checkpoint(args.model)), "base": load(base_dir)}

    def ppl(m, ids: list[int], bos: bool, tokens: int) -> float:
        step = (len(ids) - tokens) // args.windows
        total = count = 0.0
        for c in range(args.windows):
            first = [tok.bos_token_id] if bos else []
            x = torch.tensor([first + ids[c * step:c * step + tokens]])
            with torch.no_grad():
                logits = m(input_ids=x).logits[0, :-1].float()
            total += float(torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum"))
            count += x.shape[1] - 1
        return math.exp(total / count)

    rows = []
    for book in args.books.split(","):
        ids = tok(book_path(book).read_text(), add_special_tokens=False)["input_ids"]
        for bos in (False, True):
            for tokens in (256, 512):
                got = {k: ppl(m, ids, bos, tokens) for k, m in models.items()}
                rows.append({"book": book, "bos_first": bos, "tokens": tokens, **got,
                             "ratio": got["model"] / got["base"]})
                print(rows[-1], flush=True)  # noqa: T201
    df = pd.DataFrame(rows)
    print(df.to_string(index=False, float_format=lambda x: f"{x:.3f}"))  # noqa: T201
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
