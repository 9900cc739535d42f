"""Notebook speed in a Jupyter kernel, idle and beside one busy core.

Runs a notebook (default ``04_kv_compression.ipynb``) top to bottom in a fresh kernel
(nbclient), once on the idle machine and once beside ``yes > /dev/null`` (one core
kept busy), with the spin-wait ``import locos_tl`` sets in a kernel
(``GOMP_SPINCOUNT=3000``) and with libgomp's default (300,000, how it ran before), and
prints the wall times and the busy / idle ratio. Run it on an otherwise idle machine.

    python benchmarks/bench_kernel_busy.py [--notebook 01_quickstart.ipynb] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def run_once(name: str, spincount: str | None) -> float:
    import nbclient
    import nbformat

    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    env_before = os.environ.get("GOMP_SPINCOUNT")
    if spincount is None:
        os.environ.pop("GOMP_SPINCOUNT", None)
    else:
        os.environ["GOMP_SPINCOUNT"] = spincount  # the kernel inherits it
    try:
        t0 = time.perf_counter()
        nbclient.NotebookClient(nb, timeout=3600, kernel_name="python3",
                                resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
        return time.perf_counter() - t0
    finally:
        if env_before is None:
            os.environ.pop("GOMP_SPINCOUNT", None)
        else:
            os.environ["GOMP_SPINCOUNT"] = env_before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--notebook", default="04_kv_compression.ipynb")
    ap.add_argument("--repeats", type=int, default=1, help="best of this many runs")
    args = ap.parse_args()
    rows = []
    for label, spin in (("locos_tl in a kernel (GOMP_SPINCOUNT=3000)", None),
                        ("libgomp default (GOMP_SPINCOUNT=300000)", "300000")):
        idle = min(run_once(args.notebook, spin) for _ in range(args.repeats))
        busy_proc = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL)
        try:
            busy = min(run_once(args.notebook, spin) for _ in range(args.repeats))
        finally:
            busy_proc.kill()
        rows.append((label, idle, busy))
    print(f"{args.notebook}, {os.cpu_count()} CPUs")  # noqa: T201
    print(f"{'setting':45s} {'idle s':>8s} {'busy s':>8s} {'busy/idle':>10s}")  # noqa: T201
    for label, idle, busy in rows:
        print(f"{label:45s} {idle:8.1f} {busy:8.1f} {busy / idle:10.2f}")  # noqa: T201


if __name__ == "__main__":
    main()
