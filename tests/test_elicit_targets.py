"""The elicitation targets' measures: perplexity against an independent HF computation,
the made-up-word question, evaluation cells with distractors; the protocol's
``--distractors`` option."""

from __future__ import annotations

import math

import pytest
import torch

from locos_tl.data import load_needle_set
from locos_tl.data.haystack import PROSE_HAYSTACK, load_haystacks
from locos_tl.experiments.elicit_targets import (
    MADE_UP_WORDS,
    cell_trials,
    made_up_entries,
    perplexity,
)


def test_perplexity_equals_hf_cross_entropy(tiny_models, tiny_dirs):
    from transformers import AutoModelForCausalLM

    bridge = tiny_models("llama")
    text = PROSE_HAYSTACK.read_text()[:3000]
    got = perplexity(bridge, text, chunks=3, tokens=40)
    hf = AutoModelForCausalLM.from_pretrained(tiny_dirs["llama"], dtype=torch.float64)
    tok = bridge.tokenizer
    ids = tok(text, add_special_tokens=False)["input_ids"]
    step = (len(ids) - 40) // 3
    nll = n = 0.0
    for c in range(3):
        window = torch.tensor([[tok.bos_token_id] * (tok.bos_token_id is not None)
                               + ids[c * step:c * step + 40]])
        with torch.no_grad():
            out = hf(window, labels=window)  # mean over the window's predicted tokens
        nll += float(out.loss) * (window.shape[1] - 1)
        n += window.shape[1] - 1
    assert got == pytest.approx(math.exp(nll / n), rel=1e-4)  # float32 against float64


def test_made_up_question_names_no_known_link():
    entries = load_needle_set("everyday")
    made = made_up_entries(entries)
    assert [e.id for e in made] == [e.id for e in entries]
    for e in made:
        (q,) = e.questions.values()
        assert list(e.questions) == ["made_up"]
        assert any(q == f"Which character is a {w}?" for w in MADE_UP_WORDS)
        assert e.needle in [x.needle for x in entries]


def test_cells_hold_distractors_and_evaluation_names(qwen3):
    entries = load_needle_set("everyday")
    hay = load_haystacks([PROSE_HAYSTACK])
    trials = cell_trials(qwen3.tokenizer, entries, hay, question="made_up", length=400,
                         distractors=2, n=3, template="completion")
    assert len(trials) == 3
    for t in trials:
        assert len(t.meta["distractor_names"]) == 2
        assert t.meta["question"].startswith("Which character is a ")
        entry = next(e for e in entries if e.id == t.meta["entry_id"])
        assert t.answer in entry.character_set[1::2]  # the protocol's evaluation names


def test_reproduce_records_distractors_only_when_used():
    from locos_tl.cli.reproduce import parse_config
    from locos_tl.experiments.protocol.stages import _trial_sizes

    assert "distractors" not in _trial_sizes(parse_config([]))
    assert _trial_sizes(parse_config(["--distractors", "1"]))["distractors"] == 1
