"""Exact prompt lengths and needle spans, checked as properties over random inputs
with two real tokenizer kinds trained on the shared books."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trialdata_helpers import builder_for

from locos_tl.data import (
    Haystack,
    HaystackTooShortError,
    Insert,
    PromptBuilder,
    PromptTemplate,
    build_nolima_trials,
    expand_needle_set,
    parse_needle_set,
)
from locos_tl.data.nolima import DEFAULT_TASK_TEMPLATE
from locos_tl.errors import DataFormatError, TrialError

WORDS = ["river", "castle", "old", "quietly", "Zürich", "naïve", "blue", "harbour", "lantern",
         "twelve", "o'clock", "well-known", "Kraków", "seven", "the", "of", "(again)", "3.5",
         "déjà-vu", "Hudson"]
NAMES = ["Yuki", "Zoë Ngata", "O'Neill", "Mandla", "Jean-Luc"]
SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def needle_entries(draw):
    words = draw(st.lists(st.sampled_from(WORDS), min_size=2, max_size=9))
    words.insert(draw(st.integers(0, len(words))), "{CHAR}")
    words.insert(draw(st.integers(0, len(words))), "{1}")
    needle = " ".join(words) + draw(st.sampled_from([".", "!", "?", ""]))
    entry = {
        "id": "0303",
        "needle": needle,
        "questions": {"onehop": "Which character knows about {1}?"},
        "character_set": [draw(st.sampled_from(NAMES))],
        "tests": {"T01": {"input_args": [draw(st.sampled_from(WORDS[:10]))]}},
    }
    if draw(st.booleans()):
        entry["distractors"] = {"onehop": "Nobody in the village had heard of {1} before."}
    return entry


def _owned_tokens(tok, trial, text, add_special):
    """Indices of tokens overlapping the first occurrence of ``text`` in the prompt."""
    enc = tok(trial.prompt, add_special_tokens=add_special, return_offsets_mapping=True)
    assert list(enc["input_ids"]) == list(trial.tokens)  # the prompt re-tokenises to the ids
    a = trial.prompt.index(text)
    b = a + len(text)
    return [i for i, (x, y) in enumerate(enc["offset_mapping"]) if y > x and x < b and y > a]


@SETTINGS
@given(entry=needle_entries(), length=st.integers(250, 4000),
       depth=st.one_of(st.floats(0, 100), st.sampled_from([0.0, 100.0])),
       hay=st.integers(0, 2), chat=st.booleans())
def test_nolima_length_and_span_exact(tokenizer, haystacks, entry, length, depth, hay, chat):
    item = expand_needle_set(parse_needle_set([entry]))[0]
    (trial,) = build_nolima_trials(tokenizer, [item], [haystacks[hay]], lengths=[length],
                                   depths=[depth], chat_template=chat,
                                   builder=builder_for(tokenizer))
    needle = trial.meta["needle"]
    assert len(trial.tokens) == length
    s, e = trial.needle_span
    assert tokenizer.decode(list(trial.tokens[s:e])).strip() == needle
    # Whole: exactly the tokens that overlap the needle's characters form the span.
    assert _owned_tokens(tokenizer, trial, needle, not chat) == list(range(s, e))
    assert trial.answer == entry["character_set"][0]
    assert trial.meta["length"] == length and trial.meta["depth"] == depth
    assert trial.meta["haystack_index"] == hay
    # query_start: the first token after the haystack; the question is decoded after it
    q = trial.meta["query_start"]
    assert e <= q < length
    assert trial.meta["question"] in tokenizer.decode(list(trial.tokens[q:]))
    assert trial.meta["question"] not in tokenizer.decode(list(trial.tokens[:q]))
    if "distractors" in entry:
        dis = trial.meta["distractor"]
        assert trial.prompt.count(dis) == 1
        assert not set(_owned_tokens(tokenizer, trial, dis, not chat)) & set(range(s, e))


def test_depth_places_needle_at_sentence_boundaries(tokenizer, haystacks):
    items = expand_needle_set(parse_needle_set([{
        "id": "0404", "needle": "Actually, {CHAR} once rowed across {1}.",
        "questions": {"onehop": "Who has been on {1}?"}, "character_set": ["Katie"],
        "tests": {"T1": {"input_args": ["Lake Taupo"]}}}]))
    depths = [0, 10, 25, 50, 75, 90, 100]
    trials = build_nolima_trials(tokenizer, items, haystacks[:1], lengths=[4000], depths=depths,
                                 builder=builder_for(tokenizer))
    actual = [t.meta["depth_actual"] for t in trials]
    assert actual == sorted(actual)
    for t, d in zip(trials, depths, strict=True):
        assert abs(t.meta["depth_actual"] - d) <= 5, (d, t.meta["depth_actual"])
        needle = t.meta["needle"]
        before = t.prompt[: t.prompt.index(needle)]
        if d == 0:
            assert before.endswith("book snippet:\n\n")
        else:  # a sentence ended (or a paragraph broke) just before the needle
            tail = before[len(before.rstrip()):]
            assert tail, d
            assert (before.rstrip()[-1] in ".!?\"')]’”" or re.search(r"\n[ \t]*\n", tail)
                    or d == 100), (d, before[-40:])
    assert trials[0].meta["depth_actual"] == 0.0
    assert trials[-1].prompt.split(trials[-1].meta["needle"])[1].startswith("\n\nUse the")


def test_haystack_too_short_says_how_long(tokenizer, haystacks):
    builder = builder_for(tokenizer)
    hay = haystacks[0]
    n = builder.n_tokens(hay)
    tpl = PromptTemplate(DEFAULT_TASK_TEMPLATE)
    with pytest.raises(HaystackTooShortError) as exc:
        builder.build(hay, length=n + 500, template=tpl, question="Who?",
                      needle=Insert("Actually, Yuki lives in Oslo.", 50), answer="Yuki")
    msg = str(exc.value)
    assert f"has {n} tokens" in msg and f"{len(hay.text)} characters" in msg
    assert hay.name in msg


def test_length_below_template_is_an_error(tokenizer, haystacks):
    tpl = PromptTemplate(DEFAULT_TASK_TEMPLATE, "You are a helpful assistant.")
    with pytest.raises(TrialError, match="shorter than the prompt without haystack"):
        builder_for(tokenizer).build(
            haystacks[0], length=30, template=tpl, question="Who?",
            needle=Insert("Actually, Yuki lives in Oslo.", 50), answer="Yuki")


def test_small_haystack_exact_up_to_its_size(tokenizer):
    text = " ".join(f"Sentence number {i} is about the {w} harbour." for i, w in
                    enumerate(["blue", "old", "quiet", "busy"] * 30))
    hay = Haystack.from_text(text, name="tiny.txt")
    builder = PromptBuilder(tokenizer)
    tpl = PromptTemplate("Text:\n{haystack}\nQ: {question}\nA:")
    for length in (60, 200, 400):
        t = builder.build(hay, length=length, template=tpl, question="Who?",
                          needle=Insert("Later, Yuki moved to Oslo.", 40), answer="Yuki")
        assert len(t.tokens) == length
    with pytest.raises(HaystackTooShortError, match="tiny.txt"):
        builder.build(hay, length=builder.n_tokens(hay) + 100, template=tpl, question="Who?",
                      needle=Insert("Later, Yuki moved to Oslo.", 40), answer="Yuki")


def test_chat_template_thinking_disabled_and_single_bos(haystacks):
    from trialdata_helpers import get_tokenizer

    items = expand_needle_set(parse_needle_set([{
        "id": "0505", "system_prompt": "You are a careful reader.",
        "needle": "{CHAR} keeps a pet otter.", "questions": {"onehop": "Who has a pet?"},
        "character_set": ["Megan"], "tests": {"T1": {"input_args": []}}}]))
    qwen = get_tokenizer("bytelevel")
    (t,) = build_nolima_trials(qwen, items, haystacks[:1], lengths=[700], depths=[50],
                               chat_template=True, builder=builder_for(qwen))
    assert t.prompt.startswith("<|im_start|>system\nYou are a careful reader.<|im_end|>\n")
    assert t.prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert len(t.tokens) == 700
    gemma = get_tokenizer("metaspace")  # template rejects the system turn: merged into user
    bos = gemma.bos_token_id
    for chat in (True, False):
        (t,) = build_nolima_trials(gemma, items, haystacks[:1], lengths=[700], depths=[50],
                                   chat_template=chat, builder=builder_for(gemma))
        assert len(t.tokens) == 700 and t.tokens[0] == bos and t.tokens.count(bos) == 1
        if chat:
            assert t.prompt.startswith("<bos><start_of_turn>user\nYou are a careful reader.\n\n")
            assert t.prompt.endswith("<start_of_turn>model\n")


def test_chat_template_missing_is_an_error(haystacks):
    from transformers import PreTrainedTokenizerFast
    from trialdata_helpers import get_tokenizer

    bare = PreTrainedTokenizerFast(tokenizer_object=get_tokenizer("bytelevel").backend_tokenizer)
    tpl = PromptTemplate(DEFAULT_TASK_TEMPLATE, chat_template=True)
    with pytest.raises(DataFormatError, match="no chat template"):
        PromptBuilder(bare).build(haystacks[0], length=500, template=tpl, question="Who?",
                                  needle=Insert("Yuki lives in Oslo.", 50), answer="Yuki")


def test_same_inputs_same_trials(tokenizer, haystacks, needle_set_file):
    from locos_tl.data import load_needle_set

    items = expand_needle_set(load_needle_set(needle_set_file))
    kw = dict(lengths=[400, 800], depths=[0, 50, 100], num_examples=7, seed=3,
              builder=builder_for(tokenizer))
    a = build_nolima_trials(tokenizer, items, haystacks, **kw)
    b = build_nolima_trials(tokenizer, items, haystacks, **kw)
    assert [t.trial_id for t in a] == [t.trial_id for t in b] and len(a) == 7
    c = build_nolima_trials(tokenizer, items, haystacks, **{**kw, "seed": 4})
    assert [t.trial_id for t in a] != [t.trial_id for t in c]


def test_template_and_insert_validation():
    with pytest.raises(DataFormatError, match="haystack"):
        PromptTemplate("no slot here {question}")
    with pytest.raises(DataFormatError, match="question"):
        PromptTemplate("{haystack} only")
    with pytest.raises(DataFormatError, match="depth"):
        Insert("text", 101)
    with pytest.raises(DataFormatError, match="outside"):
        Insert("text", 50, (2, 9))
    rng = random.Random(0)
    assert Insert("x" * 5, rng.uniform(0, 100)).score is None
