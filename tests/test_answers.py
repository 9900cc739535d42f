"""Gate and answer-step identification (method.md Sec. 2, 'Which steps count')."""

import pytest

from locos_tl.engine.answers import answer_steps, passes_gate, rouge1_recall, rougeL_f
from locos_tl.errors import TrialError
from locos_tl.models.tiny import byte_bpe_tokenizer


@pytest.fixture(scope="module")
def tok():
    return byte_bpe_tokenizer()


def test_rouge_gate_values():
    assert rouge1_recall("The answer is Yuki.", "Yuki") == 1.0
    assert rouge1_recall("Mary Ann", "Mary Ann Smith") == pytest.approx(2 / 3)
    assert passes_gate("Mary Ann", "Mary Ann Smith")
    assert not passes_gate("Mary", "Mary Ann")  # recall 0.5 is not > 0.5
    assert rougeL_f("Yuki", "Yuki") == 1.0 and rougeL_f("Bob", "Yuki") == 0.0


def test_exact_token_match_with_leading_space(tok):
    gen = tok.encode("The answer is Yuki.", add_special_tokens=False)
    steps = answer_steps(tok, gen, "Yuki")
    assert tok.decode([gen[i] for i in steps]).strip() == "Yuki"
    assert steps == list(range(steps[0], steps[-1] + 1))
    gen2 = tok.encode("Yuki is the one", add_special_tokens=False)  # no leading space
    steps2 = answer_steps(tok, gen2, "Yuki")
    assert steps2[0] == 0 and tok.decode([gen2[i] for i in steps2]) == "Yuki"


def test_character_fallback_case_insensitive(tok):
    gen = tok.encode("the answer is YUKI!", add_special_tokens=False)
    steps = answer_steps(tok, gen, "Yuki")
    text = "".join(tok.decode([gen[i]]) for i in steps)
    assert "yuki" in text.lower() and steps
    assert answer_steps(tok, tok.encode("nobody", add_special_tokens=False), "Yuki") == []


def test_answer_that_tokenizes_to_nothing(tok):
    with pytest.raises(TrialError, match="tokenizes to nothing"):
        answer_steps(tok, [1, 2], "   ")
