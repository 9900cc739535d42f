"""Memory and time of LOCOS scoring vs plain HF SDPA generation vs the bridge's generate.

For one trial at 1k, 2k, 4k and 8k tokens on a random 4-layer, 8-head (2 kv heads),
d_model 256 Qwen3 checkpoint, each measurement runs in a fresh process and prints the
peak RSS growth over the loaded model and the wall time of:

- ``score_trials`` (LOCOS, raw variant; SDPA prefill + hooked decode steps),
- HF ``generate`` with the default SDPA attention (the floor a user compares with),
- the bridge's own ``generate`` (eager attention, hooks).

Targets: memory growth 4k->8k at most 1.3x the growth 2k->4k, read per token
(``(m8k - m4k) / 4096`` against ``(m4k - m2k) / 2048``: 1.0 for linear memory, 2.0 for
quadratic); scoring at most 1.5x HF SDPA generation at 8k. Each measurement is taken
after a warm-up call on a 64-token prompt, so first-call costs are excluded.

Usage: ``python benchmarks/bench_scoring.py [--lengths 1024,2048,4096,8192] [--new 8]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(ckpt: str, mode: str, n: int, new: int) -> None:
    import torch

    import locos_tl as lt

    torch.manual_seed(0)
    model = lt.load_model(ckpt, device="cpu")
    tokens = torch.randint(1, int(model.cfg.d_vocab) - 1, (n,)).tolist()
    trial = lt.Trial(tokens=tokens, needle_span=(n // 2, n // 2 + 8), answer="x")
    warm = tokens[:64]
    if mode == "hf_sdpa":
        from transformers import AutoModelForCausalLM

        del model
        hf = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="sdpa")

        def run(ids: list[int]) -> None:
            hf.generate(torch.tensor([ids]), max_new_tokens=new, min_new_tokens=new,
                        do_sample=False)
    elif mode == "score":

        def run(ids: list[int]) -> None:
            t = lt.Trial(tokens=ids, needle_span=(len(ids) // 2, len(ids) // 2 + 8), answer="x")
            lt.score_trials(model, [t], max_new_tokens=new, progress=False)
    else:

        def run(ids: list[int]) -> None:
            model.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False,
                           verbose=False)

    with torch.no_grad():
        run(warm)  # first-call costs (kernel selection, twin build) are not measured
        base = _rss_mb()
        t0 = time.perf_counter()
        run(tokens)
    wall = time.perf_counter() - t0
    print(json.dumps({"mode": mode, "n": n, "wall_s": wall, "peak_growth_mb": _peak_mb() - base}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="1024,2048,4096,8192")
    ap.add_argument("--new", type=int, default=8)
    ap.add_argument("--modes", default="score,hf_sdpa,bridge_generate")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        ckpt, mode, n, new = args.child
        child(ckpt, mode, int(n), int(new))
        return
    from locos_tl.models.tiny import make_tiny_checkpoint

    tmp = Path(tempfile.mkdtemp())
    ckpt = make_tiny_checkpoint(
        "qwen3", tmp / "qwen3-4l-256", num_hidden_layers=4, hidden_size=256,
        intermediate_size=512, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=16384, initializer_range=0.02,
    )
    lengths = [int(x) for x in args.lengths.split(",")]
    modes = args.modes.split(",")
    results: dict[tuple[str, int], dict] = {}
    print(f"threads={os.environ.get('OMP_NUM_THREADS', 'default')}  new tokens={args.new}")
    print(f"{'mode':<16}{'tokens':>8}{'wall s':>10}{'peak +MB':>10}")
    for n in lengths:
        for mode in modes:
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(ckpt), mode, str(n), str(args.new)],
                capture_output=True, text=True, check=True,
            ).stdout.strip().splitlines()[-1]
            r = json.loads(out)
            results[(mode, n)] = r
            print(f"{mode:<16}{n:>8}{r['wall_s']:>10.2f}{r['peak_growth_mb']:>10.0f}", flush=True)
    if all((("score", n) in results) for n in (2048, 4096, 8192)):
        g1 = results[("score", 4096)]["peak_growth_mb"] - results[("score", 2048)]["peak_growth_mb"]
        g2 = results[("score", 8192)]["peak_growth_mb"] - results[("score", 4096)]["peak_growth_mb"]
        ratio = (g2 / 4096) / max(g1 / 2048, 1e-9)
        print(f"score memory growth per token, 4k->8k / 2k->4k: {ratio:.2f} (target <= 1.3; "
              "linear = 1.0, quadratic = 2.0)")
    if ("score", 8192) in results and ("hf_sdpa", 8192) in results:
        ratio = results[("score", 8192)]["wall_s"] / results[("hf_sdpa", 8192)]["wall_s"]
        print(f"score / HF SDPA generate time at 8k: {ratio:.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
