"""Seconds per training step of ``locos elicit``, with and without bfloat16 autocast, on
this machine. Each setting runs the recipe of ``scripts/elicit_hop.sh`` (LoRA rank 32,
KL weight 1) for ``--steps`` steps in a scratch folder and reads the learning curve's
first row (training only: no validation before it). On a CPU without AMX, bfloat16
matmuls are emulated and autocast can be slower than float32; the CPU's flags are
printed beside the figures::

    python benchmarks/elicit_step_speed.py --base smollm2-135m-instruct --steps 10
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


def cpu_flags() -> str:
    """The bfloat16-relevant flags of this CPU (Linux), or ``unknown``."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0]
    except (OSError, IndexError):
        return "unknown"
    found = [f for f in ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
             if f in flags.split()]
    return " ".join(found) or "no avx512/amx"


def main() -> None:
    import torch

    from locos_tl.organisms.elicit import ElicitConfig, elicit

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="smollm2-135m-instruct")
    ap.add_argument("--steps", type=int, default=10, help="timed steps a setting")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "  # noqa: T201
          f"CPU flags: {cpu_flags()}")
    for autocast in (True, False):
        cfg = ElicitConfig(base=args.base, steps=2 * args.steps, save_every=args.steps,
                           val_every=10**6, val_trials=1, bf16_autocast=autocast,
                           text_bos=False)
        with tempfile.TemporaryDirectory() as tmp:
            elicit(cfg, tmp, log=lambda _: None)
            first = json.loads((Path(tmp) / "curve.jsonl").read_text().splitlines()[0])
        print(f"bf16 autocast {'on ' if autocast else 'off'}: "  # noqa: T201
              f"{first['seconds'] / first['step']:.2f} s/step over the first "
              f"{first['step']} steps")


if __name__ == "__main__":
    main()
