"""Plotly figures of head scores, ablation sweeps and per-position contributions."""

from __future__ import annotations

from locos_tl.plot._common import METHOD_COLORS
from locos_tl.plot.compression import compression_curves
from locos_tl.plot.curves import ablation_curves, dissociation
from locos_tl.plot.heatmap import head_heatmap
from locos_tl.plot.hop import mlp_patching_curves, score_attribution_bars
from locos_tl.plot.layers import layer_distribution
from locos_tl.plot.positions import phi_explorer, reads_vs_writes, token_labels
from locos_tl.plot.ranks import rank_scatter

__all__ = [  # in the order of the API reference page (docs/api/plot.md)
    "token_labels",
    "head_heatmap",
    "layer_distribution",
    "rank_scatter",
    "ablation_curves",
    "dissociation",
    "compression_curves",
    "phi_explorer",
    "reads_vs_writes",
    "mlp_patching_curves",
    "score_attribution_bars",
    "METHOD_COLORS",
]
