"""Trial construction from text: exact needle spans and clear errors."""

import json

import pytest

from locos_tl import Trial, TrialError, load_trials, save_trials
from locos_tl.models.tiny import byte_bpe_tokenizer

PROMPT = ("The quick brown fox jumps over the lazy dog. Actually, Yuki lives next to the "
          "Semper Opera House. The old man reads a book. Which character has been to Dresden?")
NEEDLE = "Actually, Yuki lives next to the Semper Opera House."


@pytest.fixture(scope="module")
def tok():
    return byte_bpe_tokenizer()


def test_span_decodes_to_the_needle(tok):
    t = Trial.from_text(tok, PROMPT, NEEDLE, "Yuki", meta={"depth": 25})
    s, e = t.needle_span
    assert tok.decode(list(t.tokens[s:e])).strip() == NEEDLE
    assert list(t.tokens) == tok(PROMPT)["input_ids"]
    assert t.meta == {"depth": 25} and t.prompt == PROMPT
    # the tokens right outside the span are not needle text
    assert NEEDLE not in tok.decode(list(t.tokens[s + 1 : e]))


def test_needle_absent(tok):
    with pytest.raises(TrialError, match="not found in the prompt"):
        Trial.from_text(tok, PROMPT, "Yuki lives in Tokyo.", "Yuki")


def test_needle_not_token_aligned_names_characters(tok):
    # "ctually, Yuki" starts inside the token(s) of "Actually"
    with pytest.raises(TrialError, match="not aligned to whole tokens") as exc:
        Trial.from_text(tok, PROMPT, "ctually, Yuki lives", "Yuki")
    assert "'A'" in str(exc.value) or "A" in str(exc.value).split("cover")[1]


def test_empty_answer_and_too_long(tok):
    with pytest.raises(TrialError, match="empty gold answer"):
        Trial.from_text(tok, PROMPT, NEEDLE, "  ")
    n = len(tok(PROMPT)["input_ids"])
    with pytest.raises(TrialError, match=f"{n} tokens, longer than the model's context n_ctx=10"):
        Trial.from_text(tok, PROMPT, NEEDLE, "Yuki", n_ctx=10)


def test_direct_construction_validates():
    with pytest.raises(TrialError, match="not inside the prompt"):
        Trial(tokens=(1, 2, 3), needle_span=(2, 5), answer="x")
    with pytest.raises(TrialError, match="empty prompt"):
        Trial(tokens=(), needle_span=(0, 1), answer="x")
    a = Trial(tokens=(1, 2, 3), needle_span=(0, 2), answer="x")
    b = Trial(tokens=(1, 2, 3), needle_span=(0, 2), answer="y")
    assert a.trial_id != b.trial_id and len(a.trial_id) == 16


def test_jsonl_round_trip_and_text_records(tok, tmp_path):
    t = Trial.from_text(tok, PROMPT, NEEDLE, "Yuki", meta={"k": 1})
    path = save_trials([t], tmp_path / "t.jsonl")
    assert load_trials(path) == [t]
    text = tmp_path / "text.jsonl"
    text.write_text(json.dumps({"prompt": PROMPT, "needle": NEEDLE, "answer": "Yuki"}) + "\n")
    (loaded,) = load_trials(text, tok)
    assert loaded.needle_span == t.needle_span and loaded.tokens == t.tokens
    with pytest.raises(TrialError, match="need a tokenizer"):
        load_trials(text)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": PROMPT, "answer": "Yuki"}) + "\n")
    with pytest.raises(TrialError, match=r"bad.jsonl:1: record lacks field\(s\) \['needle'\]"):
        load_trials(bad, tok)
    with pytest.raises(TrialError, match="does not exist"):
        load_trials(tmp_path / "missing.jsonl")
