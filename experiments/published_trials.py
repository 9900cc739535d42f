"""The trials of a published protocol run, rebuilt from its ``args.json`` with ``locos
reproduce --stages trials`` (the needle set, evaluation lengths and distractors it
recorded), for experiments that add measurements to that run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_args(run: Path) -> dict[str, Any]:
    """The published run's recorded arguments."""
    return json.loads((Path(run) / "args.json").read_text())


def _trial_flags() -> tuple[str, ...]:
    """The recorded options that shape the trial files: the protocol's own list
    (:data:`~locos_tl.experiments.protocol.stages.TRIAL_OPTIONS`, less the model and
    data folder given apart) and the options it records only when used."""
    from locos_tl.experiments.protocol.stages import TRIAL_OPTIONS

    return (*(k for k in TRIAL_OPTIONS if k not in ("model", "data_dir")),
            "detect_needle_set", "eval_needle_set", "distractors")


def rebuild_trials(run: Path, out: Path) -> Path:
    """The folder of the run's trial files (``detect_onehop.jsonl``,
    ``eval_onehop_1000.jsonl``, ...), rebuilt into ``out/trials`` once with every
    trial-shaping option the run recorded (:func:`_trial_flags`)."""
    args = run_args(run)
    tdir = Path(out) / "trials" / "trials"
    if not (tdir / "detect_onehop.jsonl").exists():
        cmd = [str(Path(sys.executable).parent / "locos"), "reproduce", "--model",
               args["model"], "--stages", "trials", "--out", str(Path(out) / "trials")]
        for key in _trial_flags():
            if args.get(key) not in (None, "", 0):
                cmd += [f"--{key.replace('_', '-')}", str(args[key])]
        subprocess.run(cmd, check=True)
    return tdir
