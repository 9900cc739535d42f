"""bfloat16 on CPU, end to end: scoring, ablation (decoded and teacher forced), activation
patching and KV compression run on the shipped organism
(data/organisms/retrieval-2l, 2 layers x 8 heads) loaded in bfloat16, and find what
float32 finds.

bfloat16 keeps 8 bits of mantissa: its numbers differ from float32's by about 2**-8 of
their size, so the comparisons are of findings (top heads, rank order, which answers
are right) and of values within that relative size, not of bits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from scipy.stats import spearmanr

import locos_tl as lt
from locos_tl.organisms.tasks import make_trials

ORG = Path(__file__).resolve().parents[1] / "data" / "organisms" / "retrieval-2l"
DTYPES = ("float32", "bfloat16")


@pytest.fixture(scope="module")
def setup():
    models = {dt: lt.load_model(ORG, device="cpu", dtype=dt) for dt in DTYPES}
    trials = make_trials("nonliteral", 12, 128, seed=3)
    writers = [tuple(h) for h in
               json.loads((ORG / "ground_truth.json").read_text())["nonliteral_writer"]]
    means = lt.calibrate_means(models["float32"], [t.tokens for t in trials[:6]])
    return models, trials, writers, means


def test_bf16_scoring_ranks_the_heads_as_float32(setup):
    models, trials, writers, _ = setup
    s = {dt: lt.score_trials(m, trials, method="locos", max_new_tokens=2, progress=False)
         for dt, m in models.items()}
    assert next(models["bfloat16"].original_model.parameters()).dtype == torch.bfloat16
    assert s["bfloat16"].n_trials == s["float32"].n_trials == 12
    assert set(s["bfloat16"].top_k(2)) == set(s["float32"].top_k(2)) == set(writers)
    assert s["bfloat16"].top_k(4) == s["float32"].top_k(4)
    a, b = s["float32"].scores.flatten(), s["bfloat16"].scores.flatten().double()
    assert spearmanr(a, b).statistic > 0.99
    # scores are logits summed over positions: a bf16 error of 2**-8 of the largest
    assert (a - b).abs().max() <= a.abs().max() * 2**-7


def test_bf16_ablation_and_teacher_forcing_agree_with_float32(setup):
    models, trials, writers, means = setup
    grid = dict(k=[2], seeds=[0], bottom=None, means=means, progress=False)
    contains, logp = {}, {}
    for dt, m in models.items():
        df = lt.ablation_sweep(m, trials, {"writers": writers}, max_new_tokens=2, **grid)
        contains[dt] = df[df.metric == "contains"].set_index(["method", "k"])["value"]
        tf = lt.teacher_forced_sweep(m, trials, {"writers": writers}, **grid)
        logp[dt] = tf[tf.metric == "logp_answer"].set_index(["method", "k"])["value"]
    assert contains["bfloat16"].to_dict() == contains["float32"].to_dict()
    assert contains["float32"][("baseline", 0)] == 1.0
    assert contains["float32"][("writers", 2)] <= 0.25  # the writers carry the answer
    assert logp["float32"][("writers", 2)] < logp["float32"][("baseline", 0)] - 1.0
    for key, v in logp["float32"].items():  # nats; bf16 logits are off by ~2**-8 of size
        assert abs(logp["bfloat16"][key] - v) <= 0.05 + 0.02 * abs(v), key


def test_bf16_patching_and_compression_agree_with_float32(setup):
    from locos_tl.experiments.compress import compression_sweep

    models, trials, writers, _ = setup
    cri = {dt: lt.patch_heads(m, trials[:4], answer_position="prompt_end", progress=False)
           for dt, m in models.items()}
    assert cri["bfloat16"].top_k(2) == cri["float32"].top_k(2)
    assert set(cri["float32"].top_k(2)) == set(writers)
    ranking = lt.score_trials(models["float32"], trials, method="locos", max_new_tokens=2,
                              progress=False)
    acc = {}
    for dt, m in models.items():
        df = compression_sweep(m, trials, {"locos": ranking}, fractions=(0.3, 1.0),
                               include=("uniform",), max_new_tokens=2, progress=False)
        acc[dt] = df.groupby(["ranking", "fraction"])["correct"].mean().to_dict()
    assert acc["bfloat16"] == acc["float32"]
    assert acc["float32"][("locos", 1.0)] == 1.0
    # at 30 % kept, LOCOS's budget keeps the answer (0.92 measured) where uniform's loses it
    assert acc["float32"][("locos", 0.3)] - acc["float32"][("uniform", 0.3)] >= 0.5
