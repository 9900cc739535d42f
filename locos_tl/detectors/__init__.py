"""Head detectors: accumulators fed by one stream of decoding steps."""

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
        ValueError: unknown method (the message lists the known ones) or span.
    """
    try:
        cls = DETECTORS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; use one of {sorted(DETECTORS)}") from None
    return cls(span=span)


__all__ = ["DETECTORS", "SPAN_NAMES", "Detector", "SpanName", "TrialOutcome", "get_detector",
           "Locos", "DLA", "WuCopy", "HeadKV", "HeadKVAnchor", "AttentionSpatial"]
