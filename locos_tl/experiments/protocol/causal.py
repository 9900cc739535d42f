"""The protocol's causal and compression stages: CRI activation patching and the
KV-cache compression sweep (:mod:`locos_tl.experiments.protocol`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pandas as pd

from locos_tl.experiments.protocol import common as util
from locos_tl.experiments.protocol.common import DETECTORS, OWN_PASS, _floats, _ints
from locos_tl.experiments.protocol.config import ProtocolConfig


def patch(model: Any, config: ProtocolConfig, out: Path, scores: dict[str, Any]) -> Any:
    from locos_tl.experiments.compare import compare_rankings
    from locos_tl.experiments.patching import patch_heads

    trials = util._load(out / "trials" / "detect_onehop.jsonl")
    accepted = _accepted(out / "detect", "locos")
    subset = [t for t in trials if t.trial_id in accepted][: config.n_cri]
    if not subset:
        print("patch: no accepted detection trial; CRI skipped")  # noqa: T201
        return None
    cri = saved_cri(model, config, out, subset)
    if cri is None:
        cri = patch_heads(model, subset, out_dir=out / "patch",
                          max_new_tokens=config.max_new_tokens, extend=True)  # --n-cri grows
        cri.save(out / "heads" / "cri")
    n = int(model.cfg.n_layers) * int(model.cfg.n_heads)
    ks = tuple(k for k in (5, 10, 20, 50) if k <= n)
    for name in (*DETECTORS, *OWN_PASS):
        if name in scores and scores[name].n_trials:
            agree = compare_rankings(scores[name], cri, ks=ks)
            agree.to_csv(out / "patch" / f"agreement_{name}_cri.csv", index=False)
    return cri


def saved_cri(model: Any, config: ProtocolConfig, out: Path, subset: list[Any]) -> Any:
    """CRI saved in ``heads/cri`` over exactly ``subset`` (same trials in the same order:
    ``trial_set_hash``; same model, dtype and greedy budget) when ``patch/trials.jsonl``
    lacks some of their records, else None. A run resumed from a directory published
    before the records were (``PUBLISHED``) has the scores but not the records; without
    this its patch stage would patch every head on every trial again (hours on a CPU) to
    get the same numbers. A larger ``--n-cri`` still needs the records (or patches every
    trial again)."""
    from locos_tl.heads import HeadScores
    from locos_tl.models.identity import same_model
    from locos_tl.models.load import model_dtype, model_settings
    from locos_tl.runs.records import read_records
    from locos_tl.trials import trial_set_hash

    path = out / "heads" / "cri"
    if not (path / "head_scores.json").exists():
        return None
    if {t.trial_id for t in subset} <= read_records(out / "patch").keys():
        return None  # patch_heads reuses its own records
    cri = HeadScores.load(path)
    got = cri.meta.get("settings", {})
    want = {"dtype": model_dtype(model), "max_new_tokens": config.max_new_tokens,
            "trial_set_hash": trial_set_hash(subset)}
    if {k: got.get(k) for k in want} != want:  # the hash covers every trial, in order
        return None
    if not same_model(got, model_settings(model)):  # by name and hashes, not path
        return None
    print(f"patch: CRI over {len(subset)} trials reused from {path} "  # noqa: T201
          "(its per-trial patching records are not in this run)")
    return cri


def _accepted(run: Path, method: str) -> set[str]:
    ids = set()
    with open(run / "trials.jsonl") as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("accepted"):  # the LOCOS answer-step rule
                ids.add(rec["trial_id"])
    return ids


def compress_trials(config: ProtocolConfig, out: Path) -> list[Any]:
    """The first ``--n-compress / 2`` evaluation trials of each question type, tagged
    with their ``task``."""
    trials = []
    length = _ints(config.eval_lengths)[0]
    for qtype in ("onehop", "direct"):
        ev = util._load(out / "trials" / f"eval_{qtype}_{length}.jsonl")[: config.n_compress // 2]
        trials += [dataclasses.replace(t, meta={**t.meta, "task": qtype}) for t in ev]
    return trials


def compress(model: Any, config: ProtocolConfig, out: Path, scores: dict[str, Any]) -> None:
    """The compression sweep, resumable one (trial, fraction) at a time: a rerun decodes
    only the pairs ``compression.csv`` lacks, so a larger ``--n-compress`` or a new
    fraction adds just those. Rows of trials or fractions no longer selected move to
    ``compression.previous.csv``; other rankings or decoding settings restart the sweep
    (the old file moves there too)."""
    from tqdm.auto import tqdm

    from locos_tl.experiments.compress import compression_sweep
    from locos_tl.experiments.compress.sweep import ranking_hash  # as `locos compress`

    path = out / "compress" / "compression.csv"
    settings_path = path.with_name("settings.json")
    trials = compress_trials(config, out)
    fractions = _floats(config.fractions)
    rankings = {m: scores[m] for m in ("locos", "wu", "headkv") if scores[m].n_trials > 0}
    settings = {"rankings": {m: ranking_hash(hs) for m, hs in rankings.items()},
                "include": ["uniform", "random"], "seed": 0, "unit": "query_head",
                "max_new_tokens": config.max_new_tokens}
    path.parent.mkdir(parents=True, exist_ok=True)
    old = pd.read_csv(path, dtype={"trial": str}) if path.exists() else None
    if old is not None and settings_path.exists() and \
            json.loads(settings_path.read_text()) != settings:
        print(f"compress: {path} has other rankings or settings; moved to "  # noqa: T201
              "compression.previous.csv and rerun")
        _set_aside(old, path)
        path.unlink()
        old = None
    # a sweep written before settings.json existed is taken as made with these rankings
    settings_path.write_text(json.dumps(settings, indent=1))
    order = {t.trial_id: i for i, t in enumerate(trials)}  # the index in this selection
    if old is not None:
        keep = old["trial"].isin(order) & old["fraction"].isin(fractions)
        if not keep.all():
            _set_aside(old[~keep], path)
        old = old[keep].copy()
        old["trial_index"] = old["trial"].map(order)
        old.to_csv(path, index=False)
    done = set() if old is None else set(zip(old["trial"], old["fraction"], strict=True))
    todo = [(i, t, [f for f in fractions if (t.trial_id, f) not in done])
            for i, t in enumerate(trials)]
    todo = [job for job in todo if job[2]]
    for i, t, fracs in tqdm(todo, desc="compression sweep", unit="trial"):
        rows = compression_sweep(model, [t], rankings, fracs, unit="query_head",
                                 include=("uniform", "random"), seed=0,
                                 max_new_tokens=config.max_new_tokens, progress=False)
        rows["trial_index"] = i  # the index in this run's compression trials
        rows.to_csv(path, mode="a", header=not path.exists(), index=False)


def _set_aside(rows: pd.DataFrame, path: Path) -> None:
    """Append ``rows`` to ``compression.previous.csv`` beside ``path``."""
    prev = path.with_name("compression.previous.csv")
    rows.to_csv(prev, mode="a", header=not prev.exists(), index=False)
