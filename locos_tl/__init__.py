"""locos_tl: LOCOS retrieval-head detection on TransformerLens models.

LOCOS (Logit-Contribution Scoring; Gema, Alex & Minervini 2026, arXiv 2607.01002) scores
attention head ``(l, h)`` by what it writes toward the answer from the needle span:
``phi[j] = alpha[t, j] * u_{y_t} . (v_j W_O)``, contrasted between needle and
off-needle positions.

The public names below are exported lazily (PEP 562 module ``__getattr__``):
``import locos_tl`` imports neither torch, TransformerLens nor plotly; the first access
to ``locos_tl.score_trials``, ``locos_tl.plot``, ... imports the module that defines it.
This keeps ``locos --help`` fast.

In a Jupyter kernel, importing locos_tl before torch sets ``GOMP_SPINCOUNT=3000``
(unless ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` is set): torch's OpenMP worker threads
then spin 100x shorter before sleeping between parallel regions, which keeps a kernel
from slowing down many times beside a busy core. A plain script is left as it is. The
measurements: docs/benchmarks.md, "Jupyter beside a busy core".
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if ("ipykernel" in sys.modules and "torch" not in sys.modules
        and not {"GOMP_SPINCOUNT", "OMP_WAIT_POLICY"} & set(os.environ)):
    # OpenMP reads it once, when torch loads libgomp: only before torch is imported
    os.environ["GOMP_SPINCOUNT"] = "3000"

# public name -> (module, attribute in that module; None: the module itself)
_EXPORTS: dict[str, tuple[str, str | None]] = {
    "ablate": ("locos_tl.engine.ablation", "ablate"),
    "ablation_sweep": ("locos_tl.experiments.evaluate", "ablation_sweep"),
    "AblationMeans": ("locos_tl.engine.ablation", "AblationMeans"),
    "answer_steps": ("locos_tl.engine.answers", "answer_steps"),
    "atp_heads": ("locos_tl.experiments.atp", "atp_heads"),
    "build_arithmetic_trials": ("locos_tl.data", "build_arithmetic_trials"),
    "build_niah_trials": ("locos_tl.data", "build_niah_trials"),
    "build_nolima_trials": ("locos_tl.data", "build_nolima_trials"),
    "build_parametric_trials": ("locos_tl.data", "build_parametric_trials"),
    "calibrate_means": ("locos_tl.engine.ablation", "calibrate_means"),
    "compare_rankings": ("locos_tl.experiments.compare", "compare_rankings"),
    "compression_sweep": ("locos_tl.experiments.compress", "compression_sweep"),
    "corrupt_tokens": ("locos_tl.experiments.patching", "corrupt_tokens"),
    "DataFormatError": ("locos_tl.errors", "DataFormatError"),
    "DecodeOptions": ("locos_tl.engine.options", "DecodeOptions"),
    "DecodeResult": ("locos_tl.engine.decode", "DecodeResult"),
    "DecodeStep": ("locos_tl.engine.decode", "DecodeStep"),
    "DETECTORS": ("locos_tl.detectors", "DETECTORS"),
    "dissociation_score": ("locos_tl.experiments.dissociation", "dissociation_score"),
    "expand_needle_set": ("locos_tl.data", "expand_needle_set"),
    "get_detector": ("locos_tl.detectors", "get_detector"),
    "greedy_decode": ("locos_tl.engine.decode", "greedy_decode"),
    "head_label": ("locos_tl.heads", "head_label"),
    "kv_budgets": ("locos_tl.experiments.compress", "kv_budgets"),
    "HeadScores": ("locos_tl.heads", "HeadScores"),
    "HeadSpecError": ("locos_tl.errors", "HeadSpecError"),
    "load_ablation_sweep": ("locos_tl.experiments.run_table", "load_ablation_sweep"),
    "load_haystacks": ("locos_tl.data", "load_haystacks"),
    "load_head_scores": ("locos_tl.runs.rundir", "load_head_scores"),
    "load_model": ("locos_tl.models.load", "load_model"),
    "load_needle_set": ("locos_tl.data", "load_needle_set"),
    "load_niah_probes": ("locos_tl.data", "load_niah_probes"),
    "load_trials": ("locos_tl.trials", "load_trials"),
    "LocosError": ("locos_tl.errors", "LocosError"),
    "ModelLoadError": ("locos_tl.errors", "ModelLoadError"),
    "model_pool": ("locos_tl.runs.distributed.hosts", "model_pool"),
    "paired_tests": ("locos_tl.experiments.stats", "paired_tests"),
    "parse_heads": ("locos_tl.head_spec", "parse_heads"),
    "passes_gate": ("locos_tl.engine.answers", "passes_gate"),
    "patch_heads": ("locos_tl.experiments.patching", "patch_heads"),
    "phi_from_model": ("locos_tl.engine.phi", "phi_from_model"),
    "phi_from_pattern": ("locos_tl.engine.kernel", "phi_from_pattern"),
    "qrhead_heads": ("locos_tl.experiments.qrhead", "qrhead_heads"),
    "plot": ("locos_tl.plot", None),  # lt.plot.head_heatmap, ...
    "random_heads": ("locos_tl.engine.ablation", "random_heads"),
    "RayWorkers": ("locos_tl.runs.distributed.workers", "RayWorkers"),
    "rouge1_recall": ("locos_tl.engine.answers", "rouge1_recall"),
    "rougeL_f": ("locos_tl.engine.answers", "rougeL_f"),
    "save_trials": ("locos_tl.trials", "save_trials"),
    "score_methods": ("locos_tl.experiments.score", "score_methods"),
    "ScoreOptions": ("locos_tl.runs.options", "ScoreOptions"),
    "score_trials": ("locos_tl.experiments.score", "score_trials"),
    "spatial_contrast": ("locos_tl.engine.kernel", "spatial_contrast"),
    "teacher_forced_sweep": ("locos_tl.experiments.teacher_forced", "teacher_forced_sweep"),
    "Trial": ("locos_tl.trials", "Trial"),
    "TrialError": ("locos_tl.errors", "TrialError"),
}

__all__ = [
    "ablate",
    "ablation_sweep",
    "AblationMeans",
    "answer_steps",
    "atp_heads",
    "build_arithmetic_trials",
    "build_niah_trials",
    "build_nolima_trials",
    "build_parametric_trials",
    "calibrate_means",
    "compare_rankings",
    "compression_sweep",
    "corrupt_tokens",
    "DataFormatError",
    "DecodeOptions",
    "DecodeResult",
    "DecodeStep",
    "DETECTORS",
    "dissociation_score",
    "expand_needle_set",
    "get_detector",
    "greedy_decode",
    "head_label",
    "kv_budgets",
    "HeadScores",
    "HeadSpecError",
    "load_ablation_sweep",
    "load_haystacks",
    "load_head_scores",
    "load_model",
    "load_needle_set",
    "load_niah_probes",
    "load_trials",
    "LocosError",
    "ModelLoadError",
    "model_pool",
    "paired_tests",
    "parse_heads",
    "passes_gate",
    "patch_heads",
    "phi_from_model",
    "phi_from_pattern",
    "plot",
    "qrhead_heads",
    "random_heads",
    "RayWorkers",
    "rouge1_recall",
    "rougeL_f",
    "save_trials",
    "score_methods",
    "score_trials",
    "ScoreOptions",
    "spatial_contrast",
    "teacher_forced_sweep",
    "Trial",
    "TrialError",
]


def __getattr__(name: str) -> Any:
    """Import the module that defines the public name ``name`` on first access.

    Raises:
        AttributeError: ``name`` is not a public name of locos_tl.
    """
    try:
        module_name, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'locos_tl' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # static analysers and IDEs see the eager imports
    from locos_tl import plot  # noqa: F401
    from locos_tl.data import (
        build_arithmetic_trials,
        build_niah_trials,
        build_nolima_trials,
        build_parametric_trials,
        expand_needle_set,
        load_haystacks,
        load_needle_set,
        load_niah_probes,
    )
    from locos_tl.detectors import DETECTORS, get_detector
    from locos_tl.engine.ablation import AblationMeans, ablate, calibrate_means, random_heads
    from locos_tl.engine.answers import answer_steps, passes_gate, rouge1_recall, rougeL_f
    from locos_tl.engine.decode import DecodeResult, DecodeStep, greedy_decode
    from locos_tl.engine.kernel import phi_from_pattern, spatial_contrast
    from locos_tl.engine.options import DecodeOptions
    from locos_tl.engine.phi import phi_from_model
    from locos_tl.errors import (
        DataFormatError,
        HeadSpecError,
        LocosError,
        ModelLoadError,
        TrialError,
    )
    from locos_tl.experiments.atp import atp_heads
    from locos_tl.experiments.compare import compare_rankings
    from locos_tl.experiments.compress import compression_sweep, kv_budgets
    from locos_tl.experiments.dissociation import dissociation_score
    from locos_tl.experiments.evaluate import ablation_sweep
    from locos_tl.experiments.patching import corrupt_tokens, patch_heads
    from locos_tl.experiments.qrhead import qrhead_heads
    from locos_tl.experiments.run_table import load_ablation_sweep
    from locos_tl.experiments.score import score_methods, score_trials
    from locos_tl.experiments.stats import paired_tests
    from locos_tl.experiments.teacher_forced import teacher_forced_sweep
    from locos_tl.head_spec import parse_heads
    from locos_tl.heads import HeadScores, head_label
    from locos_tl.models.load import load_model
    from locos_tl.runs.distributed.hosts import model_pool
    from locos_tl.runs.distributed.workers import RayWorkers
    from locos_tl.runs.options import ScoreOptions
    from locos_tl.runs.rundir import load_head_scores
    from locos_tl.trials import Trial, load_trials, save_trials
