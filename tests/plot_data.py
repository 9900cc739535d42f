"""Real inputs for the plot and browser tests: a tiny random-init Qwen3 and LOCOS scores.

A random model answers nonsense, so each trial's gold answer is set to what the model
itself generates; every trial then passes the gate and has answer steps, and the scores
come out of the same ``score_trials`` pass a user runs.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from locos_tl import HeadScores, Trial, greedy_decode, load_model, phi_from_model, score_methods
from locos_tl.models.tiny import make_tiny_checkpoint

NEEDLE = "Actually, Yuki lives next to the Semper Opera House."
FILLER = [
    "The quick brown fox jumps over the lazy dog.",
    "In the evening the children walked to the market and bought bread.",
    "Records were once again broken for greenhouse gas levels.",
    "The old man reads a book by the window of the little house.",
]
N_LAYERS, N_HEADS = 4, 4


@dataclass
class PlotData:
    model: Any
    trials: list[Trial]
    scores: dict[str, HeadScores]
    phi: Any
    pattern: Any
    tokens: list[str]
    needle_span: tuple[int, int]
    target: str


def build(tmp: Path, n_trials: int = 4) -> PlotData:
    ckpt = make_tiny_checkpoint("qwen3", tmp / "tiny-qwen3", num_hidden_layers=N_LAYERS,
                                num_attention_heads=N_HEADS)
    model = load_model(ckpt, device="cpu")
    tok = model.tokenizer
    trials = []
    for i in range(n_trials):
        before, after = FILLER[i % 4], FILLER[(i + 1) % 4]
        prompt = " ".join([before] * (i % 2 + 1) + [NEEDLE, after, "Who lives there?"])
        ids = tok(prompt)["input_ids"]
        gen = greedy_decode(model, ids, max_new_tokens=3, stop_rule="none",
                            stop_at_eos=False).generated
        answer = tok.decode(gen[:2])
        if not answer.strip():
            answer = tok.decode(gen)
        trials.append(Trial.from_text(tok, prompt, NEEDLE, answer, meta={"i": i}))
    scores = score_methods(model, trials, methods=["locos", "wu", "attention_spatial", "dla"],
                           max_new_tokens=3, gate_threshold=-1.0, progress=False)
    t0 = trials[0]
    first = tok(t0.answer, add_special_tokens=False)["input_ids"][0]
    phi, pattern = phi_from_model(model, t0.tokens, first, return_pattern=True)
    from locos_tl.plot import token_labels

    return PlotData(model=model, trials=trials, scores=scores, phi=phi, pattern=pattern,
                    tokens=token_labels(tok, t0.tokens), needle_span=t0.needle_span,
                    target=tok.decode([first]))


def ablation_frame(metrics: tuple[tuple[str, float], ...] = (("rougeL", 0.8),
                                                              ("contains", 0.9)),
                   scale: float = 1.0) -> pd.DataFrame:
    """A table shaped like :func:`locos_tl.ablation_sweep` output (values invented so
    the figure has structure; the plot tests check the layout, not the numbers)."""
    rng = np.random.default_rng(0)
    rows = []
    for metric, base in metrics:
        rows.append(dict(method="baseline", k=0, seed=0, metric=metric, value=base, n_trials=8))
        for k in (1, 2, 4, 8):
            drop = 0.09 * k * scale
            rows.append(dict(method="locos", k=k, seed=0, metric=metric,
                             value=max(base - drop, 0.0), n_trials=8))
            rows.append(dict(method="wu", k=k, seed=0, metric=metric,
                             value=base - drop / 3, n_trials=8))
            for seed in range(3):
                rows.append(dict(method="random", k=k, seed=seed, metric=metric,
                                 value=base - 0.01 * k * scale + rng.normal(0, 0.02), n_trials=8))
            rows.append(dict(method="locos_bottom", k=k, seed=0, metric=metric,
                             value=base - 0.005 * k, n_trials=8))
    return pd.DataFrame(rows)


@cache
def shared() -> PlotData:
    """:func:`build` once per test session (the plot and browser tests share it)."""
    return build(Path(tempfile.mkdtemp(prefix="locos-plot-")))


def all_figures(d: PlotData) -> dict[str, Any]:
    """One figure of every ``locos_tl.plot`` function, keyed by function name."""
    from locos_tl import plot

    s = d.scores
    df = ablation_frame()
    control = ablation_frame((("contains", 0.9),), scale=0.1)
    from locos_tl.experiments.dissociation import dissociation_score

    ds = dissociation_score(df, control, retrieval_metric="rougeL", control_metric="contains")
    return {
        "head_heatmap": plot.head_heatmap([s["locos"], s["attention_spatial"]]),
        "layer_distribution": plot.layer_distribution([s["locos"], s["dla"]], 5),
        "ablation_curves": plot.ablation_curves(df),
        "dissociation": plot.dissociation(ds),
        "rank_scatter": plot.rank_scatter(s["locos"], s["dla"]),
        "phi_explorer": plot.phi_explorer(d.phi, d.tokens, 0, needle_span=d.needle_span,
                                          target=d.target),
        "reads_vs_writes": plot.reads_vs_writes(d.pattern, d.phi, d.tokens, (2, 1),
                                                needle_span=d.needle_span, target=d.target),
    }
