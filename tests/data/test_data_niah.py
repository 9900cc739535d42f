"""NIAH probes: parsing, and trials whose needle span is the whole needle sentence and
whose answer span is the ``real_needle`` part."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trialdata_helpers import NIAH_FILE, builder_for

from locos_tl.data import build_niah_trials, load_niah_probes, parse_niah_probe
from locos_tl.errors import DataFormatError


@pytest.fixture(scope="module")
def shared_probes():
    return load_niah_probes(NIAH_FILE)


def test_shared_probe_file(shared_probes):
    assert len(shared_probes) == 3
    p = shared_probes[2]  # real_needle differs from the needle in case: still located
    assert p.real_needle.startswith("Because") and p.answer.startswith("because he is")
    assert p.needle[p.answer_range[0]:p.answer_range[1]] == p.answer
    assert shared_probes[1].answer == (
        "take a walk in Chaoyang Park and have a cup of Espresso in the evening")


def test_fixture_probe_file(niah_file):
    a, b = load_niah_probes(niah_file)
    assert a.answer == "smoked paprika from Vera" and a.index == 1
    assert b.answer == "under the third blue stone by the gate."


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(length=st.integers(200, 3000), depth=st.floats(0, 100), probe=st.integers(0, 2),
       chat=st.booleans())
def test_niah_spans_whole_needle_and_real_needle(tokenizer, haystacks, shared_probes, length,
                                                 depth, probe, chat):
    p = shared_probes[probe]
    (t,) = build_niah_trials(tokenizer, [p], haystacks[:1], lengths=[length], depths=[depth],
                             chat_template=chat, builder=builder_for(tokenizer))
    assert len(t.tokens) == length
    ns, ne = t.needle_span  # the whole needle sentence, minimal
    assert p.needle in tokenizer.decode(list(t.tokens[ns:ne]))
    assert p.needle not in tokenizer.decode(list(t.tokens[ns + 1:ne]))
    assert p.needle not in tokenizer.decode(list(t.tokens[ns:ne - 1]))
    s, e = t.answer_span  # the real_needle part, inside the needle
    assert ns <= s < e <= ne
    dec = tokenizer.decode(list(t.tokens[s:e]))
    assert p.answer in dec
    # minimal: dropping an edge token loses part of the answer
    assert p.answer not in tokenizer.decode(list(t.tokens[s + 1:e]))
    assert p.answer not in tokenizer.decode(list(t.tokens[s:e - 1]))
    assert p.needle in t.prompt and t.answer == p.answer
    assert t.meta["task"] == "niah" and t.meta["real_needle"] == p.real_needle


def test_niah_grid_sampling(tokenizer, haystacks, niah_file):
    probes = load_niah_probes(niah_file)
    trials = build_niah_trials(tokenizer, probes, haystacks, lengths=[300, 600],
                               depths=[0, 50, 100], num_examples=8, seed=0,
                               builder=builder_for(tokenizer))
    assert len(trials) == 8
    strata = {(t.meta["probe"], t.meta["depth"]) for t in trials}
    assert len(strata) == 6  # 2 probes x 3 depths, all represented
    assert all(len(t.tokens) == t.meta["length"] for t in trials)


@pytest.mark.parametrize(
    ("record", "msg"),
    [
        ({"question": "q?", "real_needle": "x"}, "missing field 'needle'"),
        ({"needle": "A b c.", "real_needle": "b"}, "missing field 'question'"),
        ({"needle": "A b c.", "question": "q?"}, "missing field 'real_needle'"),
        ({"needle": "A b c.", "question": "q?", "real_needle": "zzz"}, "does not occur"),
        ({"needle": "", "question": "q?", "real_needle": "b"}, "non-empty string"),
    ],
)
def test_bad_probes(tmp_path, record, msg):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"needle": "Fine b.", "question": "q?", "real_needle": "b"}) + "\n"
                 + json.dumps(record) + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=msg) as exc:
        load_niah_probes(f)
    assert "p.jsonl:2" in str(exc.value)


def test_bad_probe_files(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text("{not json\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match="p.jsonl:1: not valid JSON"):
        load_niah_probes(f)
    f.write_text("\n\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match="no probes"):
        load_niah_probes(f)
    with pytest.raises(DataFormatError, match="expected a JSON object"):
        parse_niah_probe(["x"], 3)
