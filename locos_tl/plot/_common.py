"""What every figure shares: method colours, array conversion, input checks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from locos_tl.heads import HeadScores

#: Colours of the methods, so one method has one colour in every figure.
METHOD_COLORS: dict[str, str] = {
    "locos": "#d62728",
    "wu": "#1f77b4",
    "headkv": "#9467bd",
    "headkv_anchor": "#c5b0d5",
    "attention_spatial": "#ff7f0e",
    "dla": "#8c564b",
    "cri": "#2ca02c",
    "random": "#7f7f7f",
    "bottom": "#bcbd22",
    "baseline": "#000000",
}
_FALLBACK = ["#17becf", "#e377c2", "#393b79", "#637939", "#8c6d31", "#843c39"]
_NEEDLE_FILL = "rgba(255, 193, 7, 0.30)"
_NEEDLE_LINE = "rgba(230, 150, 0, 0.9)"


def _color(method: str, i: int = 0) -> str:
    m = method.lower()
    if m.endswith("_bottom"):
        m = "bottom"
    return METHOD_COLORS.get(m, _FALLBACK[i % len(_FALLBACK)])


def _np(x: Any) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def _fmt(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{x:.4g}"


def _as_list(scores: HeadScores | Sequence[HeadScores]) -> list[HeadScores]:
    out = [scores] if isinstance(scores, HeadScores) else list(scores or [])
    if not out:
        raise ValueError("no HeadScores given")
    bad = next((x for x in out if not isinstance(x, HeadScores)), None)
    if bad is not None:
        raise ValueError(f"expected HeadScores (or a list of them), got {type(bad).__name__}; "
                         "wrap a [n_layers, n_heads] array as HeadScores(name, scores[None])")
    return out


def _check_columns(df: pd.DataFrame, cols: Sequence[str]) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"data frame lacks column(s) {missing}; has {list(df.columns)}")
