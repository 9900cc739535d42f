"""CRI activation patching with and without layer-prefix reuse, on a real model.

Patching a head of layer ``l`` leaves the corrupted run's layers below ``l`` unchanged,
so :func:`locos_tl.experiments.patching.cri_trial` starts each patched forward at the
patched layer on the corrupted run's kept ``resid_pre`` (``reuse_prefix=True``). This
script patches every head of the first ``--n`` accepted detection trials of a published
``locos reproduce`` run both ways and prints the wall time of each, whether the CRI
scores are identical, and the share of layers the reuse computes::

    python benchmarks/patch_reuse.py --n 1
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    import torch

    import locos_tl as lt
    from locos_tl.experiments.patching import cri_trial

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-nolima-v1")
    ap.add_argument("--published", default="docs/real_models/smollm2-nolima",
                    help="published run (detect/trials.jsonl: which trials were accepted)")
    ap.add_argument("--run", default="runs/real/smollm2-135m-nolima-v1",
                    help="the run directory whose trials/detect_onehop.jsonl to use")
    ap.add_argument("--n", type=int, default=1, help="trials")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--dtype", default="float32", help="float32 or bfloat16")
    ap.add_argument("--reuse-only", action="store_true",
                    help="time only the path from the patched layer")
    args = ap.parse_args()

    trials_file = Path(args.run) / "trials" / "detect_onehop.jsonl"
    if not trials_file.exists():
        raise SystemExit(f"no {trials_file}: run `locos reproduce --model {args.model} "
                         f"--stages trials` (same options as {args.published}/args.json)")
    records = [json.loads(x) for x in
               (Path(args.published) / "detect" / "trials.jsonl").read_text().splitlines()]
    accepted = {r["trial_id"] for r in records if r.get("accepted")}  # as the patch stage
    trials = [t for t in lt.load_trials(trials_file) if t.trial_id in accepted][: args.n]
    model = lt.load_model(args.model, device="cpu", dtype=args.dtype)
    L = int(model.cfg.n_layers)
    kw = dict(batch_size=1, max_new_tokens=args.max_new_tokens)
    lt.greedy_decode(model, list(trials[0].tokens[:64]), max_new_tokens=1)  # warm-up (twins)
    times = {False: 0.0, True: 0.0}
    same, diff = True, 0.0
    for t in trials:
        out = {}
        for reuse in (True,) if args.reuse_only else (False, True):
            t0 = time.perf_counter()
            out[reuse] = cri_trial(model, t, reuse_prefix=reuse, **kw)
            times[reuse] += time.perf_counter() - t0
        if args.reuse_only:
            continue
        a, b = (torch.tensor(out[r]["scores"]["cri"]) for r in (False, True))
        same &= torch.equal(a, b)
        diff = max(diff, float((a - b).abs().max()))
    if args.reuse_only:
        print(f"{args.model}, {args.dtype}, {len(trials)} trial(s), from the patched layer: "  # noqa: T201
              f"{times[True] / len(trials):.1f} s/trial")
        return
    lines = [
        f"{args.model}, {len(trials)} trial(s) of {len(trials[0].tokens)} tokens, "
        f"{L * int(model.cfg.n_heads)} heads, one head per forward",
        f"every layer: {times[False]:.1f} s ({times[False] / len(trials):.1f} s/trial)",
        f"from the patched layer: {times[True]:.1f} s ({times[True] / len(trials):.1f} s/trial)",
        f"speed-up: {times[False] / times[True]:.2f}x",
        f"layers computed per patched forward: {(L + 1) / 2 / L:.2f} of {L} on average",
        f"identical CRI: {same} (largest difference {diff:.1e} logits)",
    ]
    print("\n".join(lines))  # noqa: T201


if __name__ == "__main__":
    main()
