"""Tests on the SHIPPED model organism (data/organisms/<name>): loading, task accuracy,
causal ground truth and the LOCOS-vs-Wu double dissociation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tolerances import assert_close_within, model_tol

from locos_tl.organisms import (
    COMPILED_ORGANISM,
    SMALL_ORGANISM,
    TASKS,
    default_book_dir,
    make_trials,
)
from locos_tl.organisms import analysis as A

ORG = Path(SMALL_ORGANISM)
pytestmark = pytest.mark.skipif(not (ORG / "config.json").exists(),
                                reason="shipped organism missing")


@pytest.fixture(scope="module")
def hf():
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    return A.load_hf(ORG)


@pytest.fixture(scope="module")
def truth():
    return json.loads((ORG / "ground_truth.json").read_text())


@pytest.fixture(scope="module")
def bridge():
    from locos_tl import load_model

    return load_model(ORG, device="cpu")


def test_shipped_files_and_size():
    names = {p.name for p in ORG.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "MODEL_CARD.md",
            "ground_truth.json"} <= names
    assert sum(p.stat().st_size for p in ORG.iterdir() if p.is_file()) <= 10_000_000
    cfg = json.loads((ORG / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["num_attention_heads"] == 8 and cfg["num_key_value_heads"] < 8
    assert 2 <= cfg["num_hidden_layers"] <= 4 and 128 <= cfg["hidden_size"] <= 256


def test_tokenizer_round_trip():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ORG))
    tr = make_trials("nonliteral", 3, 40)
    for t in tr:
        assert tok(t.prompt)["input_ids"] == list(t.tokens)
    assert tok.eos_token == "</s>" and tok.bos_token == "<s>"


def test_bridge_matches_hf(hf, bridge):
    tr = make_trials("literal", 4, 48)
    ids = torch.tensor([list(t.tokens) for t in tr])
    with torch.no_grad():
        a = hf(input_ids=ids).logits
        b = bridge(ids)
    assert_close_within(b, a, model_tol(bridge, a, n_tokens=ids.shape[1]), "bridge vs HF")


@pytest.mark.parametrize("n_tokens", [64, 128])
def test_accuracy_synthetic_filler(hf, n_tokens):
    for task in TASKS:
        acc = A.accuracy(hf, make_trials(task, 120, n_tokens, seed=777))
        assert acc >= 0.95, (task, n_tokens, acc)


@pytest.fixture(scope="module")
def book():
    from locos_tl.organisms import BookFiller

    return BookFiller.from_dir(default_book_dir())


@pytest.mark.parametrize("n_tokens", [64, 128])
def test_accuracy_book_filler(hf, book, n_tokens):
    for task in TASKS:
        acc = A.accuracy(hf, make_trials(task, 100, n_tokens, seed=778, book=book))
        assert acc >= 0.9, (task, n_tokens, acc)


def test_generation_stops_after_answer(bridge):
    from locos_tl.engine.decode import greedy_decode

    t = make_trials("nonliteral", 1, 64)[0]
    res = greedy_decode(bridge, list(t.tokens), max_new_tokens=5)
    assert res.text.split()[0] == t.answer
    assert len(res.generated) <= 2  # answer, then </s>


def test_documented_ground_truth_is_causal(hf, truth):
    """The documented roles hold on fresh prompts (other seed than the card's)."""
    lit = A.examples("literal", 100, 64, seed=99)
    non = A.examples("nonliteral", 100, 64, seed=99)
    base_l, base_n = A.accuracy(hf, lit), A.accuracy(hf, non)
    writers = [tuple(h) for h in truth["nonliteral_writer"]]
    copies = [tuple(h) for h in truth["literal_copy"]]
    prev = [tuple(h) for h in truth["prev_token"]]
    assert writers and copies and prev
    assert not set(writers) & set(copies), "tasks share heads: no double dissociation"
    with A.ablate_heads(hf, writers, "zero"):
        assert A.accuracy(hf, non) <= base_n - 0.5
        assert A.accuracy(hf, lit) >= 0.8
    with A.ablate_heads(hf, copies, "zero"):
        assert A.accuracy(hf, lit) <= base_l - 0.5
        assert A.accuracy(hf, non) >= 0.8
    with A.ablate_heads(hf, prev, "zero"):
        assert A.accuracy(hf, non) <= base_n - 0.5
    prof = A.attention_profile(hf, non[:30])
    for l_, h in writers:
        assert prof["needle_landmark"][l_][h] > 0.5
        assert prof["needle_name"][l_][h] < 0.1
    for l_, h in prev:
        assert prof["prev_token_from_landmark"][l_][h] >= 0.4  # the documented criterion


# --- detectors on the organism: LOCOS finds the non-literal writers, Wu does not ---------

@pytest.fixture(scope="module")
def detector_scores(bridge):
    from locos_tl import score_methods

    trials = make_trials("nonliteral", 30, 64, seed=2024)
    return trials, score_methods(bridge, trials, methods=["locos", "wu"], progress=False)


def _bridge_accuracy(bridge, trials) -> float:
    from locos_tl.organisms.tasks import V

    t2i = V.token_to_id()
    hits = []
    for T in sorted({t.n_tokens for t in trials}):
        grp = [t for t in trials if t.n_tokens == T]
        with torch.no_grad():
            lg = bridge(torch.tensor([list(t.tokens) for t in grp]))[:, -1]
        hits += (lg.argmax(-1) == torch.tensor([t2i[t.answer] for t in grp])).tolist()
    return float(np.mean(hits))


def test_double_dissociation_locos_vs_wu(bridge, detector_scores, truth):
    from locos_tl.engine.ablation import ablate

    trials, scores = detector_scores
    K = int(truth["detector_k"])  # one k <= 3, the same for every method (= number of writers)
    assert 1 <= K <= 3
    locos_top = [tuple(h) for h in scores["locos"].top_k(K)]
    # Wu's top-k among heads it actually selects (score > 0): on this organism all but one
    # head score exactly 0, and breaking that tie by (layer, head) would "select" L0H0, an
    # essential layer-0 head no detector pointed at (see MODEL_CARD.md, Detectors).
    wu = scores["wu"].scores
    wu_top = [tuple(h) for h in scores["wu"].top_k(K) if float(wu[h[0], h[1]]) > 0]
    non = make_trials("nonliteral", 120, 64, seed=31)
    lit = make_trials("literal", 120, 64, seed=31)
    base = _bridge_accuracy(bridge, non)
    with ablate(bridge, locos_top, "output_zero"):
        acc_locos = _bridge_accuracy(bridge, non)
        acc_lit = _bridge_accuracy(bridge, lit)
    if wu_top:
        with ablate(bridge, wu_top, "output_zero"):
            acc_wu = _bridge_accuracy(bridge, non)
    else:
        acc_wu = base
    drop_locos, drop_wu = base - acc_locos, base - acc_wu
    assert drop_locos >= 0.5, (locos_top, base, acc_locos)
    assert acc_lit >= 0.8, (locos_top, acc_lit)
    assert drop_wu < drop_locos / 2, (wu_top, drop_wu, drop_locos)
    assert set(locos_top) <= {tuple(h) for h in truth["nonliteral_writer"]}, locos_top
    for l_, h in truth["nonliteral_writer"]:
        assert float(wu[l_, h]) < 0.05, ((l_, h), float(wu[l_, h]))


COMPILED = Path(COMPILED_ORGANISM)


@pytest.mark.skipif(not (COMPILED / "config.json").exists(), reason="compiled organism missing")
def test_compiled_twin_rebuilds_identically_and_works(tmp_path):
    """The hand-compiled twin is rebuilt bit-identically (by `locos train-organism
    --compiled`) and solves both tasks."""
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from locos_tl.cli import app

    log = json.loads((COMPILED / "train_log.json").read_text())
    assert log["kind"] == "compiled"
    res = CliRunner().invoke(app, ["train-organism", "--compiled", "--no-card", "--out",
                                   str(tmp_path / "org"), "--seed", str(log["seed"])])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == str(tmp_path / "org")
    new = load_file(str(tmp_path / "org" / "model.safetensors"))
    old = load_file(str(COMPILED / "model.safetensors"))
    assert new.keys() == old.keys()
    for k in old:
        assert torch.equal(new[k], old[k]), k
    m = A.load_hf(COMPILED)
    truth_c = json.loads((COMPILED / "ground_truth.json").read_text())
    non = make_trials("nonliteral", 60, 96, seed=5)
    assert A.accuracy(m, non) == 1.0
    with A.ablate_heads(m, [tuple(h) for h in truth_c["nonliteral_writer"]]):
        assert A.accuracy(m, non) <= 0.1


@pytest.mark.slow
def test_retraining_reproduces(tmp_path, truth):
    """Re-running the training script with the shipped seed reproduces accuracies (<= 0.02)."""
    from locos_tl.organisms.tasks import ContextSpec
    from locos_tl.organisms.train import TrainConfig, train

    log = json.loads((ORG / "train_log.json").read_text())
    if log.get("kind") == "compiled":
        pytest.skip("shipped organism is hand-compiled (see test_compiled_rebuild_is_identical)")
    cfg_d = dict(log["config"])
    spec = ContextSpec(**{k: tuple(v) if isinstance(v, list) else v
                          for k, v in cfg_d.pop("spec").items()})
    cfg_d["lengths"] = [tuple(x) for x in cfg_d["lengths"]]
    res = train(TrainConfig(**cfg_d, spec=spec), tmp_path / "org", log=lambda s: None)
    for key, accs in truth["accuracy"].items():
        filler, T = key.split("@")
        if filler != "synthetic":
            continue
        for task in TASKS:
            new = A.accuracy(res["model"], make_trials(task, 300, int(T)))
            assert abs(new - accs[task]) <= 0.02, (task, T, new, accs[task])


def test_hf_zero_ablation_is_bridge_output_zero(hf, bridge):
    """The cards' ablations run on the HF checkpoint (`A.ablate_heads`, fast); they are
    the library's `output_zero` through the bridge (`locos_tl.engine.ablation.ablate`)."""
    from locos_tl.engine.ablation import ablate

    ts = make_trials("nonliteral", 4, 64, seed=5)
    ids = torch.tensor([list(t.tokens) for t in ts])
    heads = [(1, 0), (0, 2), (1, 5)]
    with torch.no_grad(), A.ablate_heads(hf, heads, "zero"):
        ref = hf(input_ids=ids).logits
    with torch.no_grad(), ablate(bridge, heads, "output_zero"):
        got = bridge(ids)
    with torch.no_grad():
        plain = hf(input_ids=ids).logits
    tol = model_tol(bridge, ref, n_tokens=ids.shape[1])
    assert (ref - plain).abs().max() > 10 * tol  # the ablation changes the output
    assert_close_within(got, ref, tol, "output_zero: bridge vs HF hook")
