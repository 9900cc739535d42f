"""locos_tl: LOCOS retrieval-head detection on TransformerLens models.

LOCOS (Logit-Contribution Scoring; Gema, Alex & Minervini 2026, arXiv 2607.01002) scores
attention head ``(l, h)`` by what it writes toward the answer from the needle span:
``phi[j] = alpha[t, j] * u_{y_t} . (v_j W_O)``, contrasted between needle and
off-needle positions.
"""

from __future__ import annotations

from locos_tl.answers import answer_steps, passes_gate, rouge1_recall, rougeL_f
from locos_tl.decode import DecodeResult, DecodeStep, greedy_decode
from locos_tl.detectors import DETECTORS, get_detector
from locos_tl.errors import DataFormatError, LocosError, ModelLoadError, TrialError
from locos_tl.heads import HeadScores, head_label
from locos_tl.kernel import phi_layer, spatial_contrast
from locos_tl.models import load_model
from locos_tl.phi import phi_tensor
from locos_tl.score import score_trials
from locos_tl.trials import Trial, load_trials, save_trials

__version__ = "0.1.0"

__all__ = [
    "DETECTORS",
    "DataFormatError",
    "DecodeResult",
    "DecodeStep",
    "HeadScores",
    "LocosError",
    "ModelLoadError",
    "Trial",
    "TrialError",
    "answer_steps",
    "get_detector",
    "greedy_decode",
    "head_label",
    "load_model",
    "load_trials",
    "passes_gate",
    "phi_layer",
    "phi_tensor",
    "rouge1_recall",
    "rougeL_f",
    "save_trials",
    "score_trials",
    "spatial_contrast",
]
