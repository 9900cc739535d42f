"""Head detectors: accumulators fed by one stream of decoding steps.

:data:`DETECTORS` holds the decode-pass methods' detector classes; the registry of every
head-scoring method, those with their own forward passes included (``atp``, ``qrhead``,
``cri``), is :data:`locos_tl.experiments.methods.METHODS`.
"""

from __future__ import annotations

from locos_tl.detectors.attention import AttentionSpatial, WuCopy
from locos_tl.detectors.base import SPAN_NAMES, Detector, SpanName, TrialOutcome
from locos_tl.detectors.headkv import HeadKV, HeadKVAnchor
from locos_tl.detectors.locos import DLA, Locos

DETECTORS: dict[str, type[Detector]] = {
    "locos": Locos,
    "wu": WuCopy,
    "headkv": HeadKV,
    "headkv_anchor": HeadKVAnchor,
    "attention_spatial": AttentionSpatial,
    "dla": DLA,
}

def get_detector(name: str, span: str | None = None) -> Detector:
    """Instantiate the detector registered as ``name``.

    Args:
        name: the method name.
        span: read this trial span instead of the method's published default.

    Raises:
        ValueError: no detector of that name (the message lists them) or an unknown
            span.
    """
    try:
        cls = DETECTORS[name]
    except KeyError:
        raise ValueError(f"no decode-pass detector {name!r}; use one of "
                         f"{sorted(DETECTORS)} (score_trials(method=...) also scores the "
                         "methods with their own forward passes: "
                         "locos_tl.experiments.methods.METHODS)") from None
    return cls(span=span)


__all__ = ["DETECTORS", "SPAN_NAMES", "Detector", "SpanName",
           "TrialOutcome", "get_detector", "Locos", "DLA", "WuCopy", "HeadKV", "HeadKVAnchor",
           "AttentionSpatial"]
