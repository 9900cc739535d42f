"""locos_tl: LOCOS retrieval-head detection on TransformerLens models.

LOCOS (Logit-Contribution Scoring; Gema, Alex & Minervini 2026, arXiv 2607.01002) scores
attention head ``(l, h)`` by what it writes toward the answer from the needle span:
``phi[j] = alpha[t, j] * u_{y_t} . (v_j W_O)``, contrasted between needle and
off-needle positions.
"""

from __future__ import annotations

from locos_tl import plot  # noqa: E402  (lt.plot.head_heatmap, ...)
from locos_tl.ablation import AblationMeans, ablate, calibrate_means, random_heads
from locos_tl.answers import answer_steps, passes_gate, rouge1_recall, rougeL_f
from locos_tl.compare import compare_rankings
from locos_tl.data import (
    build_niah_trials,
    build_nolima_trials,
    expand_needle_set,
    load_haystacks,
    load_needle_set,
    load_niah_probes,
)
from locos_tl.decode import DecodeResult, DecodeStep, greedy_decode
from locos_tl.detectors import DETECTORS, get_detector
from locos_tl.errors import DataFormatError, LocosError, ModelLoadError, TrialError
from locos_tl.evaluate import dissociation_score, evaluate
from locos_tl.heads import HeadScores, head_label
from locos_tl.kernel import phi_layer, spatial_contrast
from locos_tl.models import load_model
from locos_tl.patching import corrupt_tokens, patch_heads
from locos_tl.phi import phi_tensor
from locos_tl.score import score_trials
from locos_tl.trials import Trial, load_trials, save_trials

__version__ = "0.1.0"

__all__ = [
    "ablate",
    "AblationMeans",
    "answer_steps",
    "build_niah_trials",
    "build_nolima_trials",
    "calibrate_means",
    "compare_rankings",
    "corrupt_tokens",
    "DataFormatError",
    "DecodeResult",
    "DecodeStep",
    "DETECTORS",
    "dissociation_score",
    "evaluate",
    "expand_needle_set",
    "get_detector",
    "greedy_decode",
    "head_label",
    "HeadScores",
    "load_haystacks",
    "load_model",
    "load_needle_set",
    "load_niah_probes",
    "load_trials",
    "LocosError",
    "ModelLoadError",
    "passes_gate",
    "patch_heads",
    "phi_layer",
    "phi_tensor",
    "plot",
    "random_heads",
    "rouge1_recall",
    "rougeL_f",
    "save_trials",
    "score_trials",
    "spatial_contrast",
    "Trial",
    "TrialError",
]
