"""The long-context organism `retrieval-long`: shipped files, accuracy at
1024 and 2048 tokens on fresh prompts, and its documented mechanism re-checked at length
(ablation, attention, LOCOS vs Wu) against what its card recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from locos_tl.organisms import LONG_ORGANISM, TASKS, make_trials
from locos_tl.organisms import analysis as A

ORG = Path(LONG_ORGANISM)
pytestmark = pytest.mark.skipif(not (ORG / "config.json").exists(),
                                reason="long organism missing")


@pytest.fixture(scope="module")
def hf():
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    return A.load_hf(ORG)


@pytest.fixture(scope="module")
def truth():
    return json.loads((ORG / "ground_truth.json").read_text())


def test_files_size_and_context():
    assert sum(p.stat().st_size for p in ORG.iterdir() if p.is_file()) <= 20_000_000
    cfg = json.loads((ORG / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["max_position_embeddings"] >= 4096
    assert cfg["num_hidden_layers"] >= 3
    card = (ORG / "MODEL_CARD.md").read_text()
    assert "Valid range" in card and "## The mechanism at each length" in card


def test_shipped_train_log_is_the_recipe():
    """The shipped checkpoint's recorded stages are `--preset retrieval-long`'s."""
    from locos_tl.organisms.recipes import STAGES
    from locos_tl.organisms.train import _same_config

    log = json.loads((ORG / "train_log.json").read_text())
    stages = STAGES["retrieval-long"]()
    assert [st["name"] for st in log["stages"]] == [n for n, _ in stages]
    assert all(_same_config(st["config"], c)
               for st, (_, c) in zip(log["stages"], stages, strict=True))
    assert all("final" in st and st["seconds"] > 0 for st in log["stages"])


def test_card_records_the_accuracy_and_its_valid_range(truth):
    """The organism's bar (>= 0.95 literal, >= 0.90 non-literal) holds at 1024 and 2048 tokens
    on both fillers, and the card's valid range is the table's."""
    from locos_tl.organisms.lengths import valid_range

    acc = truth["accuracy"]
    for filler in ("synthetic", "book"):
        for T in (1024, 2048):
            assert acc[f"{filler}@{T}"]["literal"] >= 0.95, (filler, T)
            assert acc[f"{filler}@{T}"]["nonliteral"] >= 0.90, (filler, T)
    for T in (512, 4096):
        assert f"synthetic@{T}" in acc  # reported, no bar
    assert truth["valid_range"] == valid_range(acc)  # the card's range is the table's
    assert truth["valid_range"]["min_valid"] <= 1024
    assert truth["valid_range"]["max_valid"] >= 2048


@pytest.mark.parametrize("n_tokens", [1024, 2048])
def test_accuracy_on_fresh_prompts(hf, n_tokens):
    """Other seed than the card's: within sampling error of the card's bar."""
    for task in TASKS:
        acc = A.accuracy(hf, make_trials(task, 60, n_tokens, seed=909))
        assert acc >= 0.9, (task, n_tokens, acc)


def test_mechanism_recorded_at_every_length(truth):
    by = truth["by_length"]
    assert {"1024", "2048"} <= set(by)
    for T in ("1024", "2048"):
        crit = by[T]["criteria"]
        assert all(crit.values()), (T, crit)


def test_documented_writers_are_causal_at_1024(hf, truth):
    """Fresh prompts, plain HF hooks (independent of LOCOS and of the card's run)."""
    writers = [tuple(h) for h in truth["nonliteral_writer"]]
    copies = [tuple(h) for h in truth["literal_copy"]]
    assert writers and copies and not set(writers) & set(copies)
    non = A.examples("nonliteral", 60, 1024, seed=77)
    lit = A.examples("literal", 60, 1024, seed=77)
    base = A.accuracy(hf, non)
    with A.ablate_heads(hf, writers, "zero"):
        assert A.accuracy(hf, non) <= base - 0.5
        assert A.accuracy(hf, lit) >= 0.8
    prof = A.attention_profile(hf, non[:8])
    for l_, h in writers:
        assert prof["needle_landmark"][l_][h] > 0.5, (l_, h)


def test_locos_finds_the_writers_wu_does_not_at_1024(truth):
    from locos_tl import load_model, score_methods

    bridge = load_model(ORG, device="cpu")
    trials = make_trials("nonliteral", 10, 1024, seed=515)
    sc = score_methods(bridge, trials, methods=["locos", "wu"], progress=False)
    writers = {tuple(h) for h in truth["nonliteral_writer"]}
    top = {tuple(h) for h in sc["locos"].top_k(len(writers))}
    assert len(top & writers) >= len(writers) - 1, (top, writers)
    for l_, h in writers:
        assert abs(float(sc["wu"].scores[l_, h])) <= 0.05


@pytest.mark.slow
def test_retraining_reproduces(tmp_path, truth):
    """`python -m locos_tl.organisms.train --preset retrieval-long` (its stages, about 1.5
    hours on one CPU thread) reproduces the card's synthetic-filler accuracies (<= 0.03)."""
    from locos_tl.organisms.recipes import STAGES, train_stages
    from locos_tl.organisms.train import _same_config

    stages = STAGES["retrieval-long"]()
    log = json.loads((ORG / "train_log.json").read_text())
    assert all(_same_config(st["config"], c)
               for st, (_, c) in zip(log["stages"], stages, strict=True))
    train_stages(stages, tmp_path / "org", tmp_path / "work", log=lambda s: None)
    model = A.load_hf(tmp_path / "org", attn="sdpa")
    for T in (1024, 2048):
        for task in TASKS:
            new = A.accuracy(model, make_trials(task, 200, T))
            old = truth["accuracy"][f"synthetic@{T}"][task]
            assert abs(new - old) <= 0.03, (task, T, new, old)
