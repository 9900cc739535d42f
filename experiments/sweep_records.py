"""The generation records of an experiment's ablation sweep (the ``out_dir`` of
:func:`locos_tl.ablation_sweep`), published beside its tables so that a clone rebuilds
them without generating: ``--publish`` copies them, ``--resume-from`` starts from them."""

from __future__ import annotations

import shutil
from pathlib import Path

#: the record files of the sweep's cells
RECORDS = ("trials.jsonl", "jobs.json", "meta.json")


def start_records(records: Path, seed: Path | None) -> None:
    """Copy the records folder ``seed`` to ``records`` unless ``records`` exists (a
    sweep resumes its own records first); nothing when ``seed`` is None."""
    if seed is not None and not records.exists():
        shutil.copytree(seed, records)


def publish_records(records: Path, dest: Path) -> None:
    """Copy the sweep's record files (:data:`RECORDS`) from ``records`` into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in RECORDS:
        shutil.copyfile(records / name, dest / name)
