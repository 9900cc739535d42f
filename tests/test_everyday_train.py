"""The shipped training needle set (``everyday_train``) is disjoint from the evaluation
set (``everyday``): other names, other needles, other questions; and its non-literal
questions share no content word with their needles."""

from __future__ import annotations

import json
import re

import pytest

from locos_tl.data import expand_needle_set, load_needle_set
from locos_tl.data.nolima import NEEDLE_SETS_DIR, shipped_needle_sets

STOP = set("the a an of in on at by to for is was are be been which character who has have "
           "had each every this that with from and or its it his her their one last does do "
           "did some".split())


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z']+", text.lower().replace("{char}", ""))
            if w not in STOP}


@pytest.fixture(scope="module")
def sets():
    return load_needle_set("everyday_train"), load_needle_set("everyday")


def test_training_set_is_shipped_and_large_enough(sets):
    train, _ = sets
    assert "everyday_train" in shipped_needle_sets()
    assert len(train) >= 60
    assert len(expand_needle_set(train, ["onehop"])) >= 240  # 4 tests an entry
    assert {e.reasoning_type for e in train} <= {"hypernym", "synonym", "everyday"}


def test_disjoint_from_the_evaluation_set(sets):
    train, evaluation = sets
    names = {n for e in train for n in e.character_set}
    assert not names & {n for e in evaluation for n in e.character_set}
    assert not {e.needle for e in train} & {e.needle for e in evaluation}
    for qt in ("direct", "onehop"):
        assert not {e.questions[qt] for e in train} & {e.questions[qt] for e in evaluation}
    # the files are distinct, not one set under two names
    assert (NEEDLE_SETS_DIR / "everyday_train.json").read_bytes() != \
        (NEEDLE_SETS_DIR / "everyday.json").read_bytes()


def test_onehop_questions_share_no_content_word_with_their_needle(sets):
    train, _ = sets
    for e in train:
        needle_words = set()
        for t in e.tests.values():
            text = e.needle
            for i, a in enumerate(t.input_args, 1):
                text = text.replace(f"{{{i}}}", a)
            needle_words |= _words(text)
        q = _words(e.questions["onehop"])
        shared = {w for w in q for x in needle_words
                  if w == x or (min(len(w), len(x)) >= 5 and w[:5] == x[:5])}
        assert not shared, (e.id, shared)


def test_every_entry_parses_with_four_tests(sets):
    train, _ = sets
    raw = json.loads((NEEDLE_SETS_DIR / "everyday_train.json").read_text())
    assert len(raw) == len(train)
    assert all(len(e.tests) == 4 and len(e.character_set) == 30 for e in train)
