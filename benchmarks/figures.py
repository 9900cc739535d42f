"""Saving a benchmark's plotly figure: :func:`save_figure` of ``experiments/figures.py``
(one helper for both script folders; a script imports it from beside itself)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "experiments_figures", Path(__file__).resolve().parents[1] / "experiments" / "figures.py")
_MODULE = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_MODULE)
save_figure = _MODULE.save_figure
