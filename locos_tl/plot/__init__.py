"""Plotly figures of head scores, ablation sweeps and per-position contributions.

One figure a function; each returns a ``plotly.graph_objects.Figure`` (call ``.show()``
in Jupyter, ``.write_html(path)`` for a self-contained file). Head heatmaps follow the
TransformerLens convention: x = head, y = layer (layer 0 on top), RdBu centred at 0,
hover label ``L{l}H{h}``.

The figures are those of Gema, Alex & Minervini (2026, arXiv 2607.01002): LOCOS head
maps, where the top heads sit in depth, ablation curves with random-seed error bars, the
dissociation score ``DS(k)``, LOCOS vs causal (CRI) rankings, and the per-position
contributions ``phi[l, h, j]`` (Eq. 2) that separate what a head *reads* (attention)
from what it *writes* toward the answer.

One module a kind of figure; every function is importable from ``locos_tl.plot``:
:mod:`~locos_tl.plot.heatmap` (:func:`head_heatmap`), :mod:`~locos_tl.plot.layers`
(:func:`layer_distribution`), :mod:`~locos_tl.plot.ranks` (:func:`rank_scatter`),
:mod:`~locos_tl.plot.curves` (:func:`ablation_curves`, :func:`dissociation`),
:mod:`~locos_tl.plot.compression` (:func:`compression_curves`) and
:mod:`~locos_tl.plot.positions` (:func:`phi_explorer`, :func:`reads_vs_writes`,
:func:`token_labels`). :data:`METHOD_COLORS` gives one method one colour in every figure.
"""

from __future__ import annotations

from locos_tl.plot._common import METHOD_COLORS
from locos_tl.plot.compression import compression_curves
from locos_tl.plot.curves import ablation_curves, dissociation
from locos_tl.plot.heatmap import head_heatmap
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
    "METHOD_COLORS",
]
