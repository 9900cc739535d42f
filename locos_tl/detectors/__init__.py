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

#: Methods that run their own forward passes per trial instead of reading the shared
#: decode pass: attribution patching (:mod:`locos_tl.experiments.atp`) and QRHead
#: (:mod:`locos_tl.experiments.qrhead`). ``score_methods`` scores them beside the
#: detectors; a run directory keeps each one's records in its own folder ``D/<method>/``.
FORWARD_METHODS: tuple[str, ...] = ("atp", "qrhead")


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
        if name in FORWARD_METHODS:
            raise ValueError(f"{name!r} is no decode-step detector: it runs its own forward "
                             "passes (score_methods or score_trials score it)") from None
        raise ValueError(f"unknown method {name!r}; use one of {sorted(DETECTORS)}") from None
    return cls(span=span)


__all__ = ["DETECTORS", "FORWARD_METHODS", "SPAN_NAMES", "Detector", "SpanName",
           "TrialOutcome", "get_detector", "Locos", "DLA", "WuCopy", "HeadKV", "HeadKVAnchor",
           "AttentionSpatial"]
