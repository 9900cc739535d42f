"""Prompt forms of the NoLiMa trials (chat template or completion), as the elicitation and
its evaluation pick them: ``auto`` follows the tokenizer; a completion trial ends where
the name starts and trains on `` NAME.``."""

from __future__ import annotations

import copy

import pytest

from locos_tl.data import load_haystacks, load_needle_set
from locos_tl.data.haystack import PROSE_HAYSTACK
from locos_tl.data.nolima import COMPLETION_TASK_TEMPLATE, prompt_form, resolve_template
from locos_tl.errors import DataFormatError
from locos_tl.models.tiny import byte_bpe_tokenizer

CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def hay():
    return load_haystacks([PROSE_HAYSTACK])


@pytest.fixture(scope="module")
def tokenizers():
    plain = byte_bpe_tokenizer()
    chat = copy.deepcopy(plain)
    chat.chat_template = CHAT
    return plain, chat


def test_auto_follows_the_tokenizer(tokenizers):
    plain, chat = tokenizers
    assert resolve_template("auto", chat) == "chat"
    assert resolve_template("auto", plain) == "completion"
    assert resolve_template("completion", chat) == "completion"
    with pytest.raises(DataFormatError, match="no chat template"):
        resolve_template("chat", plain)
    with pytest.raises(DataFormatError, match="'chat' or 'completion'"):
        resolve_template("chatml", chat)
    assert prompt_form("completion") == {"chat_template": False, "template": "completion"}


def _trials(tok, template, entries, hay):
    from locos_tl.organisms.elicit_data import training_trials

    return training_trials(tok, entries, hay, steps=4, lengths=(800,), distractors=(1,),
                           question_types=("onehop",), seed=0, template=template)


def test_completion_trials_end_where_the_name_starts(tokenizers, hay):
    pytest.importorskip("peft", reason="the elicit extra is not installed")
    from locos_tl.organisms.elicit import answer_ids

    plain, chat = tokenizers
    entries = load_needle_set("hop_train")[:6]
    done = _trials(plain, "completion", entries, hay)
    tail = COMPLETION_TASK_TEMPLATE.split("{question}")[1]
    for t in done:
        assert t.meta["template"] == "completion" and not t.meta["chat_template"]
        assert t.prompt.endswith(t.meta["question"] + tail)
        assert "<|" not in t.prompt
        assert len(t.tokens) == 800
        want = plain(f" {t.answer}.", add_special_tokens=False)["input_ids"]
        assert answer_ids(plain, t) == [*want, plain.eos_token_id]
    chatted = _trials(chat, "chat", entries, hay)
    for t in chatted:
        assert t.prompt.endswith("<|end|><|assistant|>") and t.meta["chat_template"]
        want = chat(t.answer, add_special_tokens=False)["input_ids"]
        assert answer_ids(chat, t) == [*want, chat.eos_token_id]
    # the same entries, names and needle depths; only the frame differs
    assert [t.answer for t in done] == [t.answer for t in chatted]
    assert [t.meta["depth"] for t in done] == [t.meta["depth"] for t in chatted]


def test_evaluation_cells_pick_the_form_from_the_tokenizer(tokenizers, hay):
    from locos_tl.experiments.elicit_targets import cell_trials

    plain, chat = tokenizers
    entries = load_needle_set("hop_eval")[:4]
    kw = dict(question="onehop", length=800, distractors=1, n=2)
    (a, _), (b, _) = (cell_trials(tok, entries, hay, **kw)
                      for tok in (plain, chat))
    assert a.meta["template"] == "completion" and b.meta["chat_template"]
    with pytest.raises(DataFormatError, match="no chat template"):
        cell_trials(plain, entries, hay, template="chat", **kw)
