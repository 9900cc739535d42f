"""Constants and small helpers of the paper's protocol (:mod:`locos_tl.experiments.protocol`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from locos_tl.errors import ConfigError
from locos_tl.experiments.methods import METHODS

STAGES = ("trials", "detect", "calibrate", "ablate", "patch", "compress", "report")
#: the patch stage's method: CRI over ``--n-cri`` detection trials, compared with every
#: ranking (``patch/agreement_<method>_cri.csv``), not ablated
PATCH_METHOD = "cri"
#: the methods the detect stage scores in one decode pass over the detection trials: the
#: registry's decode-pass methods but variants (``headkv_anchor``)
DETECTORS = tuple(m.name for m in METHODS.values() if m.decode_pass and m.variant_of is None)
#: the registry's own-pass methods the detect stage scores when ``--methods`` names them
OWN_PASS = tuple(m.name for m in METHODS.values()
                 if not m.decode_pass and m.name != PATCH_METHOD)
#: Wu scored again on the NIAH trials (``detect_niah/``), as Wu et al. publish it: the
#: protocol's one ranking that is not a method of the registry on the detection trials
WU_NIAH = "wu_niah"
#: every ranking ``--methods`` may name (or ``baseline`` alone)
RANKINGS = (*DETECTORS, WU_NIAH, *OWN_PASS)
PRESETS: dict[str, dict[str, Any]] = {
    # the protocol (GPU-sized: about 12,000 generations at 1-2k tokens)
    "full": dict(n_detect=80, n_eval=60, n_niah=30, n_control=50, n_cri=20, n_compress=40,
                 eval_lengths="1000,2000", random_seeds="0,1,2",
                 methods="locos,wu_niah,wu,attention_spatial,headkv,dla",
                 fractions="0.05,0.1,0.2,0.5,1.0", ks="1,5,10,20,50",
                 questions="onehop,direct"),
    # what a 2-core CPU affords (the committed SmolLM2 results, grown over several
    # sessions with --workers 2: about 5,700 ablated generations): the k sweep of every
    # ranking on the literal (direct) questions, where these small models retrieve; the
    # non-literal sweep and 2000 tokens are extra runs on smaller grids
    # (docs/real_models.md, "Reproduce")
    "cpu": dict(n_detect=60, n_eval=60, n_niah=12, n_control=12, n_cri=3, n_compress=40,
                eval_lengths="1000", random_seeds="0,1,2", ks="1,5,10,20,50",
                questions="direct",
                methods="locos,wu_niah,wu,attention_spatial,headkv,dla",
                fractions="0.05,0.1,0.2,0.5,1.0"),
}
DETECT_SEED, EVAL_SEED = 101, 202
#: (retrieval, control) metric pairs of the reported DS(k): the paper's, and "contains"
DS_METRICS = (("rougeL", "exact_match"), ("contains", "contains"))
DETECT_DEPTHS = (10, 30, 50, 70, 90)
EVAL_DEPTHS = (0, 25, 50, 75, 100)


def _names(item: Any, parity: int) -> Any:
    """The item with only the names of index parity ``parity`` (disjoint name sets)."""
    names = tuple(item.character_set[parity::2]) or tuple(item.character_set)
    return dataclasses.replace(item, character_set=names)


def _save(trials: list[Any], path: Path) -> None:
    from locos_tl.trials import save_trials

    save_trials(trials, path)


def _load(path: Path) -> list[Any]:
    from locos_tl.trials import load_trials

    return load_trials(path)


def _mark(out: Path, stage: str, info: dict[str, Any]) -> None:
    d = out / "stages"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{stage}.done").write_text(json.dumps(info, indent=1, default=str))


def _bootstrap(values: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """95 % percentile bootstrap interval of the mean
    (:func:`locos_tl.experiments.stats.bootstrap_ci`)."""
    from locos_tl.experiments.stats import bootstrap_ci

    return bootstrap_ci(values, 0.95, seed)


def _ints(text: str) -> list[int]:
    return [int(x) for x in str(text).split(",") if x.strip()]


def _methods(methods: str) -> list[str]:
    return [m.strip() for m in methods.split(",") if m.strip()]


def _baseline_only(methods: str) -> bool:
    """``--methods baseline``: the unablated answers only (no ranking, random, bottom-k)."""
    return _methods(methods) == ["baseline"]


def rankings_for_ablation(scores: dict[str, Any], methods: str) -> dict[str, Any]:
    """The head sets the ablation sweeps: the rankings ``--methods`` names (each one of
    :data:`RANKINGS`, by its registry name; ``baseline`` alone: none).

    Raises:
        ConfigError: a name that is not one of :data:`RANKINGS`.
    """
    if _baseline_only(methods):
        return {}
    out = {}
    for name in _methods(methods):
        if name not in RANKINGS:
            raise ConfigError(f"unknown --methods entry {name!r}; choose from "
                              f"{', '.join(RANKINGS)}, or 'baseline' alone")
        hs = scores.get(name)
        if hs is not None and hs.n_trials > 0:
            out[name] = hs
        else:
            print(f"ablation: {name} accepted no detection trial; left out")  # noqa: T201
    return out


def _questions(config: Any) -> list[str]:  # a ProtocolConfig (config.py imports this module)
    return [q.strip() for q in config.questions.split(",") if q.strip()]


def _floats(text: str) -> list[float]:
    return [float(x) for x in str(text).split(",") if x.strip()]
