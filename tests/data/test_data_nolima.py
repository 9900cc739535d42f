"""NoLiMa needle-set parsing, validation, expansion and the seed rule."""

from __future__ import annotations

import copy
import json
import random

import pytest
from trialdata_helpers import needle_set_entries

from locos_tl.data import (
    choose_characters,
    expand_needle_set,
    load_needle_set,
    nolima_cells,
    nolima_seed,
    parse_needle_set,
)
from locos_tl.data.nolima import DEFAULT_TASK_TEMPLATE
from locos_tl.errors import DataFormatError


def test_load_and_expand(needle_set_file):
    entries = load_needle_set(needle_set_file)
    assert [e.id for e in entries] == ["0101", "0202"]
    assert entries[0].task_template == DEFAULT_TASK_TEMPLATE
    assert "<text>" in entries[1].task_template
    items = expand_needle_set(entries)
    got = [(i.entry_id, i.test_id, i.question_type) for i in items]
    assert got == [("0101", "T01", "onehop"), ("0101", "T01", "twohop"),
                   ("0101", "T02", "onehop"), ("0101", "T02", "twohop"),
                   ("0202", "T01", "onehop")]
    it = items[3]
    assert it.needle == "Actually, {CHAR} lives next to the Sky Tower."
    assert it.question == "Which character has been to the North Island?"
    assert it.distractor is None
    assert it.realise("Yuki") == ("Actually, Yuki lives next to the Sky Tower.",
                                  "Which character has been to the North Island?", "Yuki")
    assert len(expand_needle_set(entries, ["onehop"])) == 3
    assert len(expand_needle_set(entries, ["twohop"])) == 2


def test_distractor_variant(distractor_set_file):
    items = expand_needle_set(load_needle_set(distractor_set_file))
    assert items[0].distractor == "There was an article about Sydney in the morning paper."
    assert items[1].distractor == "There was an article about New South Wales in the morning paper."
    assert items[4].distractor == "Someone mentioned the Mona Lisa at dinner."


def test_gold_answers_override_character():
    e = needle_set_entries()[:1]
    e[0]["tests"]["T01"]["gold_answers"] = ["{CHAR} (near {1})"]
    it = expand_needle_set(parse_needle_set(e))[0]
    assert it.realise("Katie")[2] == "Katie (near the Harbour Bridge)"


def test_unknown_question_type_lists_available(needle_set_file):
    with pytest.raises(DataFormatError, match=r"available: \['onehop', 'twohop'\]"):
        expand_needle_set(load_needle_set(needle_set_file), ["threehop"])


def test_seed_rule_and_character_choice():
    assert nolima_seed("0401", 0) == 42 + 401
    assert nolima_seed("0401_T01", 3) == 42 + 401 + 3
    entry = parse_needle_set(needle_set_entries())[0]
    cs = list(entry.character_set)
    for h in range(4):
        assert choose_characters(entry, h) == [random.Random(42 + 101 + h).choice(cs)]
    two = choose_characters(entry, 1, k=3)
    assert two == random.Random(42 + 101 + 1).sample(cs, 3) and len(set(two)) == 3
    with pytest.raises(DataFormatError, match="cannot draw 9"):
        choose_characters(entry, 0, k=9)
    with pytest.raises(DataFormatError, match="4 digits"):
        nolima_seed("ab01", 0)


def test_cells_cover_the_grid(needle_set_file, haystacks):
    items = expand_needle_set(load_needle_set(needle_set_file), ["onehop"])
    cells = nolima_cells(items, haystacks, [1000, 2000], [0, 50, 100], characters_per_entry=2)
    assert len(cells) == 3 * len(haystacks) * 2 * 2 * 3
    for c in cells:
        entry_chars = choose_characters(items[c.item], c.haystack_index, 2)
        assert c.character in entry_chars


def _bad(mutate):
    entries = copy.deepcopy(needle_set_entries(True))
    mutate(entries)
    return entries


@pytest.mark.parametrize("field", ["id", "needle", "questions", "character_set", "tests"])
def test_missing_field_named(field):
    entries = _bad(lambda e: e[1].pop(field))
    with pytest.raises(DataFormatError) as exc:
        parse_needle_set(entries, source="set.json")
    msg = str(exc.value)
    assert f"missing field '{field}'" in msg and "set.json" in msg
    assert ("entry '0202'" in msg) if field != "id" else ("entry #1" in msg)


@pytest.mark.parametrize(
    ("mutate", "needles"),
    [
        (lambda e: e[1]["questions"].update(onehop="Who has seen {3}?"),
         ["entry '0202'", "'questions.onehop'", "{3}", "test 'T01'", "only 2 input_args"]),
        (lambda e: e[0].update(needle="Actually, {CHAR} lives next to {4}."),
         ["entry '0101'", "'needle'", "{4}", "only 3 input_args"]),
        (lambda e: e[0]["distractors"].update(twohop="An article about {5}."),
         ["entry '0101'", "'distractors.twohop'", "{5}"]),
        (lambda e: e[0].update(needle="Actually, Yuki lives next to {1}."),
         ["entry '0101'", "'needle'", "no {CHAR} slot"]),
        (lambda e: e[0].update(needle="Actually, {char} lives next to {1}."),
         ["entry '0101'", "'needle'", "no {CHAR} slot"]),
        (lambda e: e[0].update(needle="{CHAR} lives next to {place}."),
         ["entry '0101'", "unknown slot {place}"]),
        (lambda e: e[0]["tests"]["T02"].pop("input_args"),
         ["entry '0101'", "'tests.T02' lacks 'input_args'"]),
        (lambda e: e[0]["tests"]["T02"].update(input_args="Sydney"),
         ["entry '0101'", "'tests.T02.input_args' must be a list"]),
        (lambda e: e[1].update(character_set=[]),
         ["entry '0202'", "'character_set' must be a non-empty list"]),
        (lambda e: e[1].update(questions={}), ["entry '0202'", "'questions'"]),
        (lambda e: e[1].update(task_template="{haystack} only"),
         ["entry '0202'", "'task_template'"]),
        (lambda e: e[1].update(id="0101"), ["entry '0101'", "duplicate id"]),
        (lambda e: e[1].update(id="abc"), ["entry 'abc'", "4 digits"]),
        (lambda e: e[0]["tests"]["T01"].update(gold_answers=["{CHAR} {7}"]),
         ["'tests.T01.gold_answers[0]'", "{7}"]),
    ],
)
def test_malformed_entries_name_entry_and_field(mutate, needles):
    with pytest.raises(DataFormatError) as exc:
        parse_needle_set(_bad(mutate))
    for n in needles:
        assert n in str(exc.value), (n, str(exc.value))


def test_malformed_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[{", encoding="utf-8")
    with pytest.raises(DataFormatError, match="bad.json is not valid JSON"):
        load_needle_set(bad)
    bad.write_text(json.dumps({"id": "0101"}), encoding="utf-8")
    with pytest.raises(DataFormatError, match="non-empty JSON list"):
        load_needle_set(bad)
    with pytest.raises(DataFormatError, match="does not exist"):
        load_needle_set(tmp_path / "missing.json")
    with pytest.raises(DataFormatError, match="entry #0 is not a JSON object"):
        parse_needle_set(["oops"])
