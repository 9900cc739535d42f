"""Head detectors: accumulators fed by one stream of decoding steps.

Every detector maps a :class:`~locos_tl.decode.DecodeStep` to a per-head value
(``[n_layers, n_heads]``) and reduces the values of the steps it uses to one per-trial
score. All detectors share one decode pass (``score_trials(methods=[...])``).
"""

from __future__ import annotations

from locos_tl.detectors.attention import AttentionSpatial, HeadKV, WuCopy
from locos_tl.detectors.base import Detector
from locos_tl.detectors.locos import DLA, Locos

DETECTORS: dict[str, type[Detector]] = {
    "locos": Locos,
    "wu": WuCopy,
    "headkv": HeadKV,
    "attention_spatial": AttentionSpatial,
    "dla": DLA,
}


def get_detector(name: str) -> Detector:
    """Instantiate the detector registered as ``name``.

    Raises:
        ValueError: unknown method; the message lists the known ones.
    """
    try:
        return DETECTORS[name]()
    except KeyError:
        raise ValueError(f"unknown method {name!r}; use one of {sorted(DETECTORS)}") from None


__all__ = ["DETECTORS", "Detector", "get_detector", "Locos", "DLA", "WuCopy", "HeadKV",
           "AttentionSpatial"]
