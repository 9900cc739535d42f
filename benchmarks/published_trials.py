"""The trials of a published protocol run, rebuilt from its ``args.json`` with ``locos
reproduce --stages trials`` (the needle set, evaluation lengths and distractors it
recorded), for benchmarks that add measurements to that run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_args(run: Path) -> dict[str, Any]:
    """The published run's recorded arguments."""
    return json.loads((Path(run) / "args.json").read_text())


def rebuild_trials(run: Path, out: Path) -> Path:
    """The folder of the run's trial files (``detect_onehop.jsonl``,
    ``eval_onehop_1000.jsonl``, ...), rebuilt into ``out/trials`` once."""
    args = run_args(run)
    tdir = Path(out) / "trials" / "trials"
    if not (tdir / "detect_onehop.jsonl").exists():
        cmd = [str(Path(sys.executable).parent / "locos"), "reproduce", "--model",
               args["model"], "--stages", "trials", "--needle-set", args["needle_set"],
               "--eval-lengths", str(args["eval_lengths"]), "--out", str(Path(out) / "trials")]
        if args.get("distractors"):
            cmd += ["--distractors", str(args["distractors"])]
        subprocess.run(cmd, check=True)
    return tdir
