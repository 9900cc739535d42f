"""Are the elicited model's heads the base model's? Rank agreement of published head
scores (:func:`locos_tl.compare_rankings`) with the chance level of each top-k overlap.

Pairs (all SmolLM2-135M, 270 heads): the elicited model's rankings on non-literal
distractor trials (``--elicited``: ``docs/real_models/smollm2-nolima``, the first
elicited model, or ``smollm2-hop/protocol``) against the base model's on
literal trials (``docs/real_models/smollm2-literal``) and on non-literal trials without
distractors (``docs/real_models/smollm2``). The p-value of an overlap is the
hypergeometric chance of at least that many shared heads between two random top-k sets.
Prints one table and writes it to ``--out``::

    python benchmarks/head_overlap.py --out docs/real_models/smollm2-nolima/head_overlap.csv
    python benchmarks/head_overlap.py --elicited smollm2-hop/protocol \\
        --out docs/real_models/smollm2-hop/protocol/head_overlap.csv
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path("docs/real_models")
FIRST = "smollm2-nolima"  # smollm2-135m-nolima-v1's published run


def pairs(elicited: str) -> list[tuple[str, str, str]]:
    """(label, ranking, ranking) pairs for the elicited model's run ``elicited`` (a
    folder of ``docs/real_models`` with ``heads/``)."""
    out = [
        ("LOCOS: elicited non-literal vs base literal", f"{elicited}/heads/locos",
         "smollm2-literal/heads/locos"),
        ("LOCOS: elicited non-literal vs base non-literal", f"{elicited}/heads/locos",
         "smollm2/heads/locos"),
        ("LOCOS: base literal vs base non-literal", "smollm2-literal/heads/locos",
         "smollm2/heads/locos"),
        ("Wu: elicited non-literal vs base literal", f"{elicited}/heads/wu",
         "smollm2-literal/heads/wu"),
        ("DLA: elicited non-literal vs base literal", f"{elicited}/heads/dla",
         "smollm2-literal/heads/dla"),
        ("attention-spatial: elicited non-literal vs base literal",
         f"{elicited}/heads/attention_spatial", "smollm2-literal/heads/attention_spatial"),
        ("elicited: LOCOS vs DLA", f"{elicited}/heads/locos", f"{elicited}/heads/dla"),
        ("elicited: LOCOS vs Wu", f"{elicited}/heads/locos", f"{elicited}/heads/wu"),
    ]
    if elicited != FIRST:
        out.append(("LOCOS: this elicited model vs smollm2-135m-nolima-v1",
                    f"{elicited}/heads/locos", f"{FIRST}/heads/locos"))
    return out


KS = (5, 10, 20)


def main() -> None:
    import pandas as pd
    from scipy import stats

    import locos_tl as lt

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elicited", default=FIRST,
                    help="the elicited model's published run, a folder of docs/real_models")
    ap.add_argument("--out", default=None, help="write the table here (CSV)")
    args = ap.parse_args()
    rows = []
    for label, a, b in pairs(args.elicited):
        sa, sb = lt.load_head_scores(ROOT / a), lt.load_head_scores(ROOT / b)
        n = sa.scores.numel()
        agree = lt.compare_rankings(sa, sb, ks=KS).set_index("bucket").loc["all"]
        row = {"pair": label, "spearman": agree["spearman"]}
        for k in KS:
            shared = round(agree[f"top{k}_overlap"] * k)
            row[f"top{k}_shared"] = shared
            row[f"top{k}_p"] = float(stats.hypergeom.sf(shared - 1, n, k, k))
        rows.append(row)
    df = pd.DataFrame(rows)
    if args.out:
        df.to_csv(args.out, index=False)
    print(f"chance overlap of two random top-k sets of {n} heads: "  # noqa: T201
          + ", ".join(f"top {k}: {k * k / n:.2f}" for k in KS))
    print(df.to_string(index=False, float_format=lambda x: f"{x:.2g}"))  # noqa: T201


if __name__ == "__main__":
    main()
