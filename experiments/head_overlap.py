"""Are the elicited model's heads the base model's? Rank agreement of published head
scores (:func:`locos_tl.compare_rankings`) with the chance level of each top-k overlap.

Pairs (by default SmolLM2-135M, 270 heads; ``--base`` and ``--literal`` name another
base model's runs): the elicited model's rankings on non-literal
distractor trials (``--elicited``: ``docs/real_models/smollm2-nolima``, the first
elicited model, or ``smollm2-hop/protocol``) against the base model's on
literal trials (``docs/real_models/smollm2-literal``) and on non-literal trials without
distractors (``docs/real_models/smollm2``). The p-value of an overlap is the
hypergeometric chance of at least that many shared heads between two random top-k sets.
Prints one table and writes it to ``--out``::

    python experiments/head_overlap.py --out docs/real_models/smollm2-nolima/head_overlap.csv
    python experiments/head_overlap.py --elicited smollm2-hop/protocol \\
        --out docs/real_models/smollm2-hop/protocol/head_overlap.csv
    python experiments/head_overlap.py --elicited gemma3-hop/protocol --base gemma3 \\
        --literal none --first none --out docs/real_models/gemma3-hop/protocol/head_overlap.csv
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path("docs/real_models")
FIRST = "smollm2-nolima"  # smollm2-135m-nolima-v1's published run


def pairs(elicited: str, base: str = "smollm2", literal: str | None = "smollm2-literal",
          first: str | None = FIRST) -> list[tuple[str, str, str]]:
    """(label, ranking, ranking) pairs for the elicited model's run ``elicited`` (a
    folder of ``docs/real_models`` with ``heads/``), its base model's runs on
    non-literal (``base``) and literal (``literal``; ``None``: none published) trials,
    and an earlier elicited model of the same base (``first``; ``None``: none)."""
    out = []
    if literal is not None:
        out += [("LOCOS: elicited non-literal vs base literal", f"{elicited}/heads/locos",
                 f"{literal}/heads/locos")]
    out += [("LOCOS: elicited non-literal vs base non-literal", f"{elicited}/heads/locos",
             f"{base}/heads/locos")]
    if literal is not None:
        out += [("LOCOS: base literal vs base non-literal", f"{literal}/heads/locos",
                 f"{base}/heads/locos")]
    ref = literal if literal is not None else base
    kind = "literal" if literal is not None else "non-literal"
    out += [(f"{m}: elicited non-literal vs base {kind}", f"{elicited}/heads/{d}",
             f"{ref}/heads/{d}")
            for m, d in (("Wu", "wu"), ("DLA", "dla"), ("attention-spatial", "attention_spatial"))]
    out += [("elicited: LOCOS vs DLA", f"{elicited}/heads/locos", f"{elicited}/heads/dla"),
            ("elicited: LOCOS vs Wu", f"{elicited}/heads/locos", f"{elicited}/heads/wu")]
    if first is not None and elicited != first:
        label = "smollm2-135m-nolima-v1" if first == FIRST else first
        out.append((f"LOCOS: this elicited model vs {label}",
                    f"{elicited}/heads/locos", f"{first}/heads/locos"))
    return out


KS = (5, 10, 20)


def _run_or_none(text: str) -> str | None:
    """A published run's folder name; ``none`` (or nothing) for no such run."""
    return None if text in ("none", "") else text


def main() -> None:
    import pandas as pd
    from scipy import stats

    import locos_tl as lt

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elicited", default=FIRST,
                    help="the elicited model's published run, a folder of docs/real_models")
    ap.add_argument("--base", default="smollm2",
                    help="the base model's published non-literal run (gemma3 for Gemma)")
    ap.add_argument("--literal", default="smollm2-literal", type=_run_or_none,
                    help="the base model's published literal run ('none': no such run)")
    ap.add_argument("--first", default=FIRST, type=_run_or_none,
                    help="an earlier elicited model's run to compare with ('none')")
    ap.add_argument("--out", default=None, help="write the table here (CSV)")
    args = ap.parse_args()
    rows = []
    for label, a, b in pairs(args.elicited, args.base, args.literal, args.first):
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
