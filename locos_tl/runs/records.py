"""Resumable run directories: one JSON line per finished trial, plus ``meta.json``.

A rerun with the same settings skips finished trials; a crash loses at most the trial
in flight (each record is flushed and fsynced when written).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

from locos_tl.errors import LocosError
from locos_tl.models.identity import HASHES_KEY, recorded_identity, same_model

RECORDS_FILE = "trials.jsonl"
META_FILE = "meta.json"
#: The setting that identifies a run's trials (:func:`locos_tl.trials.trial_set_hash`).
TRIAL_SET_KEY = "trial_set_hash"


def read_records(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    """The records of a run directory (``trials.jsonl``) keyed by ``trial_id``, later
    lines winning; a line cut by a crash (or not a record) is skipped: that trial reruns."""
    path = Path(run_dir) / RECORDS_FILE
    records: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and "trial_id" in rec:
                records[rec["trial_id"]] = rec
    return records


class RecordStore:
    """Append-only JSON-lines store of per-trial records keyed by ``trial_id``.

    Args:
        out_dir: the run directory (created).
        settings: the run's settings; a directory holding records written under other
            settings (``check_keys``) or over another trial set (``trial_set_hash``,
            always checked when both runs record it) is refused rather than mixed.
        check_keys: which settings must match for resuming. ``"model"`` compares the
            model's identity (name and content hashes, ``model_hashes``;
            :func:`locos_tl.models.identity.same_model`), not where it sits: a run
            made under another cache root or on another machine resumes, and one
            recorded with a cache path (before identities were) is read as the
            identity that path encodes.
        extend_to: the trial ids of the run now (opt-in growth): a directory over
            another trial set is taken over when every trial its records name
            (``trial_field``) is among these, so a run grows from 20 to 60 trials
            keeping its 20. Records are keyed by trial id (a hash of the trial's
            content for locos_tl's trials); settings outside ``check_keys`` are not
            compared.
        trial_field: the record field naming its trial (for ``extend_to``).

    Raises:
        LocosError: ``out_dir`` holds a run with different settings or another trial
            set (the message names both trial-set hashes and the way out); with
            ``extend_to``, records over a trial that is not in it (named).
    """

    def __init__(self, out_dir: str | Path, settings: dict[str, Any],
                 check_keys: Iterable[str] = (), *,
                 extend_to: Collection[str] | None = None,
                 trial_field: str = "trial_id") -> None:
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / RECORDS_FILE
        meta_path = self.dir / META_FILE
        self.records: dict[str, dict[str, Any]] = read_records(self.dir)
        if meta_path.exists() and self.path.exists():
            old = json.loads(meta_path.read_text()).get("settings", {})
            way_out = (f"a run directory holds one run: use a new --out directory, or "
                       f"delete {self.dir} to start this one over")
            new_hash = settings.get(TRIAL_SET_KEY)
            if old.get(TRIAL_SET_KEY) is not None and new_hash is not None \
                    and old[TRIAL_SET_KEY] != new_hash \
                    and not self._extends(extend_to, trial_field):
                raise LocosError(
                    f"{self.dir} holds a run over another trial set (trial-set hash "
                    f"{old[TRIAL_SET_KEY]}, {old.get('n_trials', '?')} trials) than the "
                    f"one given now (trial-set hash {new_hash}, "
                    f"{settings.get('n_trials', '?')} trials); {way_out}"
                )
            diff = [k for k in check_keys if k in old and old[k] != settings.get(k)
                    and k not in ("model", HASHES_KEY)]  # the model: by identity
            details = [f"{k}: {old[k]!r} != {settings.get(k)!r}" for k in diff]
            if "model" in check_keys and "model" in old and not same_model(old, settings):
                details.insert(0, f"model: {recorded_identity(old)} != "
                                  f"{recorded_identity(settings)}")
            if details:
                detail = ", ".join(details)
                raise LocosError(
                    f"{self.dir} holds a run with other settings ({detail}); {way_out}"
                )

    def _extends(self, new_ids: Collection[str] | None, field: str) -> bool:
        """Whether the stored records all lie in ``new_ids`` (``extend_to``)."""
        if new_ids is None:
            return False
        wanted = set(new_ids)
        outside = sorted({str(r.get(field)) for r in self.records.values()
                          if r.get(field) not in wanted})
        if outside:
            raise LocosError(
                f"{self.dir} cannot be extended to the trials given: its records cover "
                f"{len(outside)} trial(s) that are not among them (e.g. {outside[0]}); "
                f"use a new --out directory, or delete {self.dir}")
        return True

    def __contains__(self, trial_id: str) -> bool:
        return trial_id in self.records

    def get(self, trial_id: str) -> dict[str, Any] | None:
        return self.records.get(trial_id)

    def append(self, record: dict[str, Any]) -> None:
        """Write one record durably (flush + fsync) and remember it."""
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.records[record["trial_id"]] = record

    def write_meta(self, meta: dict[str, Any]) -> Path:
        """Write ``meta.json`` (provenance and settings)."""
        p = self.dir / META_FILE
        p.write_text(json.dumps(meta, indent=2, default=str))
        return p


def run_records(
    trials: Sequence[Any],
    score_one: Callable[[Any], dict[str, Any]],
    *,
    out_dir: str | Path | None,
    settings: dict[str, Any],
    check_keys: Iterable[str],
    meta: dict[str, Any],
    desc: str,
    progress: bool = True,
    on_resume: Callable[[int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """One record per trial, reusing the finished ones of ``out_dir`` (resumable).

    ``score_one(trial)`` makes a trial's record (a dict with ``trial_id``); with
    ``out_dir`` each new record is appended to its :class:`RecordStore` as it finishes
    and ``meta`` is written to ``meta.json``; ``on_resume(n_reused, n_trials)`` is
    called once first. Used by the methods with their own forward passes (AtP, QRHead).

    Raises:
        LocosError: ``out_dir`` holds a run with other ``settings`` (``check_keys``) or
            another trial set.
    """
    from tqdm.auto import tqdm

    store = RecordStore(out_dir, settings, check_keys) if out_dir is not None else None
    if store is not None:
        store.write_meta(meta)
    reused = [store.get(t.trial_id) if store is not None else None for t in trials]
    if on_resume is not None and store is not None:
        on_resume(sum(r is not None for r in reused), len(trials))
    records = []
    for t, rec in zip(tqdm(trials, desc=desc, unit="trial", disable=not progress), reused,
                      strict=True):
        if rec is None:
            rec = score_one(t)
            if store is not None:
                store.append(rec)
        records.append(rec)
    return records
