"""Peak memory of attribution patching's backward, with and without per-layer
recomputation, on real Gemma-3-270m (float32, CPU).

One NIAH trial per length (the first probe, needle at 50 % depth, ``dracula_part1``),
``atp_trial(answer_position="prompt_end")``, each measurement in a fresh process with
``MALLOC_MMAP_THRESHOLD_=65536`` (freed blocks go back to the system, so the resident
set follows the live tensors). Printed: the peak resident set during the call minus the
resident set after loading (first-call costs included: the same for both modes), wall
time, and the growth per token between consecutive lengths. ``--mode full_graph`` turns
the recomputation off (the backward keeps every layer's activations, as AtP did before
:mod:`locos_tl.engine.recompute`); the two modes give the same scores bit for bit
(tests/test_atp.py), which the script checks too.

Usage: ``python benchmarks/atp_memory.py [--lengths 1024,4096,8192] [--modes recompute,full_graph]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import time

from bench_scoring import _rss_mb  # beside this script: the resident set in MB


def child(mode: str, n: int) -> None:
    import torch

    import locos_tl as lt
    import locos_tl.experiments.atp as atp
    from locos_tl.data.packaged import book_path, niah_probes_path

    model = lt.load_model("gemma-3-270m", device="cpu")
    hay = lt.load_haystacks([book_path("dracula_part1")])
    probes = lt.load_niah_probes(niah_probes_path())
    trial = lt.build_niah_trials(model.tokenizer, probes[:1], hay, lengths=[n], depths=[50],
                                 num_examples=1, seed=0)[0]
    if mode == "full_graph":
        atp.checkpointed_layers = lambda layers: contextlib.nullcontext()
        atp.frozen_cache = lambda cache: cache
    base = _rss_mb()
    t0 = time.perf_counter()
    rec = atp.atp_trial(model, trial, answer_position="prompt_end")
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    scores = torch.tensor(rec["scores"]["atp"])
    print(json.dumps({"mode": mode, "tokens": n, "seconds": seconds,
                      "peak_growth_mb": peak - base, "shared_prefix": rec["shared_prefix"],
                      "scores": scores.tolist()}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="1024,4096,8192")
    ap.add_argument("--modes", default="recompute,full_graph")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS=str(args.threads),
               MKL_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false")
    rows: dict[tuple[str, int], dict] = {}
    for n in [int(x) for x in args.lengths.split(",")]:
        for mode in args.modes.split(","):
            out = subprocess.run([sys.executable, __file__, "--child", mode, str(n)], env=env,
                                 capture_output=True, text=True, check=True).stdout
            rows[mode, n] = json.loads(out.strip().splitlines()[-1])
            r = rows[mode, n]
            print(f"{mode:11s} {n:6d} tokens  {r['seconds']:7.1f} s  "
                  f"{r['peak_growth_mb']:7.0f} MB  (shared prefix {r['shared_prefix']})")
        if ("recompute", n) in rows and ("full_graph", n) in rows:
            same = rows["recompute", n]["scores"] == rows["full_graph", n]["scores"]
            print(f"  scores equal bit for bit at {n}: {same}")
    for mode in args.modes.split(","):
        ns = sorted(n for m, n in rows if m == mode)
        for a, b in zip(ns, ns[1:], strict=False):
            per = (rows[mode, b]["peak_growth_mb"] - rows[mode, a]["peak_growth_mb"]) / (b - a)
            print(f"{mode}: growth {a}->{b}: {per:.3f} MB a token")


if __name__ == "__main__":
    main()
