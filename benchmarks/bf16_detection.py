"""bfloat16 against float32 on CPU: the protocol's detection stage on a real model.

Runs ``locos reproduce --stages trials,detect`` twice on the same trials, in float32 and
in bfloat16, and prints per detector the accepted trials, the rank agreement of the two
rankings (Spearman, Kendall, top-10 overlap, same top head), how many greedy responses
changed, and the wall time of each detection. Run it on an idle machine::

    python benchmarks/bf16_detection.py --model smollm2-135m-instruct --out runs/bf16
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

DETECTORS = ("locos", "wu", "attention_spatial", "dla")


def _responses(run: Path) -> dict[str, tuple[str, bool]]:
    out = {}
    for line in (run / "detect" / "trials.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out[rec["trial_id"]] = (rec["response"], bool(rec.get("accepted")))
    return out


def main() -> None:
    import pandas as pd

    import locos_tl as lt
    from locos_tl.experiments.protocol.config import ProtocolConfig
    from locos_tl.experiments.protocol.main import run_protocol

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--out", default="runs/bf16")
    ap.add_argument("--n-detect", type=int, default=60)
    args = ap.parse_args()
    seconds = {}
    for dtype in ("float32", "bfloat16"):
        t0 = time.perf_counter()
        run_protocol(ProtocolConfig(model=args.model, stages="trials,detect", dtype=dtype,
                                    n_detect=args.n_detect, out=f"{args.out}/{dtype}"))
        seconds[dtype] = time.perf_counter() - t0
    a, b = Path(args.out) / "float32", Path(args.out) / "bfloat16"
    rows = []
    for m in DETECTORS:
        x, y = lt.load_head_scores(a / "detect", m), lt.load_head_scores(b / "detect", m)
        row = {"method": m, "accepted_fp32": x.n_trials, "accepted_bf16": y.n_trials}
        if x.n_trials and y.n_trials:
            c = lt.compare_rankings(x, y, ks=(10,)).iloc[0]
            row.update(spearman=round(float(c["spearman"]), 3),
                       kendall=round(float(c["kendall"]), 3),
                       top10_overlap=float(c["top10_overlap"]),
                       same_top_head=x.top_k(1) == y.top_k(1))
        rows.append(row)
    ra, rb = _responses(a), _responses(b)
    same = sum(ra[k][0] == rb[k][0] for k in ra)
    both = sum(ra[k][1] and rb[k][1] for k in ra)
    print(pd.DataFrame(rows).to_string(index=False))  # noqa: T201
    print(f"greedy responses equal in both dtypes: {same} of {len(ra)}; "  # noqa: T201
          f"trials accepted in both: {both}")
    print(f"wall time (trials + detection): float32 {seconds['float32']:.0f} s, "  # noqa: T201
          f"bfloat16 {seconds['bfloat16']:.0f} s")


if __name__ == "__main__":
    main()
