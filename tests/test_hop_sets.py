"""The shipped ``hop_train``, ``hop_detect``, ``hop_eval`` and ``hop_val`` needle sets
(the onehop elicitation's training, detection, evaluation and cross-kind validation
sets): sizes and link kinds, non-literal onehop questions, and the disjointness the sets
promise (among themselves and with ``everyday`` / ``everyday_train``).
:func:`violations` states the rules once; the mutation tests show it catches a break of
each."""

from __future__ import annotations

import dataclasses
import re
import runpy
from collections import defaultdict
from pathlib import Path

import pytest

from locos_tl.data import expand_needle_set, load_needle_set
from locos_tl.data.needle_sets import content_words, lexical_overlaps, shared_content_words
from locos_tl.data.nolima import NEEDLE_SETS_DIR, NoLiMaEntry, shipped_needle_sets

HOP = ("hop_train", "hop_detect", "hop_eval", "hop_val")
OLD = ("everyday", "everyday_train")
MIN_ENTRIES = {"hop_train": 150, "hop_detect": 40, "hop_eval": 40, "hop_val": 20}
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sets() -> dict[str, list[NoLiMaEntry]]:
    return {name: load_needle_set(name) for name in HOP + OLD}


def _filled(entries, qtype="onehop"):
    """(entry id, filled needle with {CHAR}, filled question) of every test."""
    return [(it.entry_id, it.needle, it.question) for it in expand_needle_set(entries, [qtype])]


def _kinds(entries) -> dict[str, list[NoLiMaEntry]]:
    out = defaultdict(list)
    for e in entries:
        out[e.reasoning_type].append(e)
    return out


def _slot_values(entries) -> set[str]:
    return {a for e in entries for t in e.tests.values() for a in t.input_args}


def violations(sets: dict[str, list[NoLiMaEntry]]) -> list[str]:
    """Every broken rule of the hop sets, as short messages (``[]``: all hold)."""
    bad: list[str] = []
    train, detect, ev, val = (sets[n] for n in HOP)
    # -- sizes and kinds
    for name, n in MIN_ENTRIES.items():
        if len(sets[name]) < n:
            bad.append(f"{name}: {len(sets[name])} entries < {n}")
    kinds = _kinds(train)
    if len(kinds) < 10:
        bad.append(f"hop_train: {len(kinds)} link kinds < 10")
    for kind, es in kinds.items():
        if len({e.needle for e in es}) < 3 or len({e.questions["onehop"] for e in es}) < 3:
            bad.append(f"hop_train {kind}: fewer than 3 needle templates or onehop phrasings")
    if len({tuple(e.character_set) for e in train}) < len(train) // 2:
        bad.append("hop_train: character sets barely vary across entries")
    # -- every entry, every test
    for name in HOP:
        for e in sets[name]:
            if set(e.questions) != {"direct", "onehop"} or e.needle.count("{CHAR}") != 1:
                bad.append(f"{name} {e.id}: questions or {{CHAR}}")
            if len(e.tests) < 4 or len({t.input_args for t in e.tests.values()}) < len(e.tests):
                bad.append(f"{name} {e.id}: fewer than 4 distinct tests")
            if len(e.character_set) < 2 or len(set(e.character_set)) < len(e.character_set):
                bad.append(f"{name} {e.id}: character set")
        for eid, tid, shared in lexical_overlaps(sets[name], "onehop"):
            bad.append(f"{name} {eid} {tid}: onehop shares {sorted(shared)} with its needle")
        for it in expand_needle_set(sets[name], ["direct"]):
            needle = it.needle.replace("{CHAR}", " ")
            if len(shared_content_words(needle, it.question)) < 0.6 * len(content_words(needle)):
                bad.append(f"{name} {it.entry_id} {it.test_id}: direct does not repeat the needle")
    # -- disjointness
    names = list(sets)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if a in OLD and b in OLD:
                continue  # the two old sets are not this file's business
            if shared := {e.id for e in sets[a]} & {e.id for e in sets[b]}:
                bad.append(f"{a}/{b}: shared entry ids {sorted(shared)[:3]}")
            fa = {t: _filled(sets[a], t) for t in ("direct", "onehop")}
            fb = {t: _filled(sets[b], t) for t in ("direct", "onehop")}
            needles_a = {n for rows in fa.values() for _, n, _ in rows}
            needles_b = {n for rows in fb.values() for _, n, _ in rows}
            if shared := needles_a & needles_b:
                bad.append(f"{a}/{b}: shared filled needles {sorted(shared)[:2]}")
            qs_a = {q for rows in fa.values() for _, _, q in rows}
            qs_b = {q for rows in fb.values() for _, _, q in rows}
            if shared := qs_a & qs_b:
                bad.append(f"{a}/{b}: shared questions {sorted(shared)[:2]}")
            if a in HOP and b in HOP or a in HOP and b in OLD:
                na = {n for e in sets[a] for n in e.character_set}
                nb = {n for e in sets[b] for n in e.character_set}
                if shared := na & nb:
                    bad.append(f"{a}/{b}: shared character names {sorted(shared)[:3]}")
    # detection: kinds may repeat training's, nothing else may
    if shared := {e.needle for e in train} & {e.needle for e in detect}:
        bad.append(f"hop_detect: needle templates from training {sorted(shared)[:2]}")
    q_train = {q for e in train for q in e.questions.values()}
    if shared := q_train & {q for e in detect for q in e.questions.values()}:
        bad.append(f"hop_detect: question templates from training {sorted(shared)[:2]}")
    if shared := _slot_values(train) & _slot_values(detect):
        bad.append(f"hop_detect: slot values from training {sorted(shared)[:3]}")
    # evaluation: link kinds absent from training altogether
    if shared := set(_kinds(train)) & set(_kinds(ev)):
        bad.append(f"hop_eval: link kinds from training {sorted(shared)}")
    # validation across kinds: kinds, cues and targets of no other set
    others = [train, detect, ev]
    if len(_kinds(val)) < 4:
        bad.append(f"hop_val: {len(_kinds(val))} link kinds < 4")
    if shared := set(_kinds(val)) & {k for s in others for k in _kinds(s)}:
        bad.append(f"hop_val: link kinds from another set {sorted(shared)}")
    if shared := _slot_values(val) & {v for s in others for v in _slot_values(s)}:
        bad.append(f"hop_val: slot values from another set {sorted(shared)[:3]}")
    return bad


# ---------------------------------------------------------------- the shipped sets
def test_hop_sets_are_shipped_and_load_by_name(sets):
    assert set(HOP) <= set(shipped_needle_sets())
    for name in HOP:
        assert (NEEDLE_SETS_DIR / f"{name}.json").is_file()
        assert len(sets[name]) >= MIN_ENTRIES[name]


def test_hop_sets_keep_every_rule(sets):
    assert violations(sets) == []


def test_sizes_and_kinds(sets):
    train, detect, ev, val = (sets[n] for n in HOP)
    assert len(val) >= 20 and len(_kinds(val)) >= 4
    assert len(train) >= 150 and len(detect) >= 40 and len(ev) >= 40
    kt, kd, ke = (_kinds(s) for s in (train, detect, ev))
    assert len(kt) >= 10 and set(kd) <= set(kt) and not set(ke) & set(kt)
    assert len(ke) >= 4 and all(len(es) >= 3 for es in ke.values())
    # several templates and phrasings per training kind, varied fills within a kind
    for es in kt.values():
        assert len({e.needle for e in es}) >= 3 and len({e.questions["onehop"] for e in es}) >= 3
        assert len(_slot_values(es)) >= 8


def test_onehop_names_the_link_target_not_the_needle_cue(sets):
    """The onehop question asks for what the cue links to ({2}), the needle names the
    cue ({1}): ``Paris`` in the needle, ``France`` in the question."""
    for name in HOP:
        for e in sets[name]:
            assert "{1}" in e.needle and "{2}" not in e.needle, e.id
            assert "{2}" in e.questions["onehop"] and "{1}" not in e.questions["onehop"], e.id
            assert "{1}" in e.questions["direct"], e.id
            assert all(q.startswith("Which character") for q in e.questions.values()), e.id
            for t in e.tests.values():
                cue, target = t.input_args
                assert cue.lower() != target.lower(), (e.id, t.input_args)


def test_names_are_absent_from_the_protocol_haystacks(sets):
    from locos_tl.data.haystack import PROSE_HAYSTACK

    texts = [PROSE_HAYSTACK.read_text(encoding="utf-8")] + [
        p.read_text(encoding="utf-8")
        for p in (ROOT / "locos_tl" / "data" / "books").glob("*.txt")]
    names = {n for s in HOP for e in sets[s] for n in e.character_set}
    assert len(names) >= 60
    assert not [n for n in names for t in texts if re.search(rf"\b{n}\b", t)]


def test_files_are_the_generator_output():
    """scripts/make_hop_sets.py is deterministic and wrote exactly these files."""
    ns = runpy.run_path(str(ROOT / "scripts" / "make_hop_sets.py"), run_name="not_main")
    assert ns["main"](["--check"]) == 0


# ----------------------------------------------------- the rules catch a violation
def _swap(entries, i, **changes):
    out = list(entries)
    out[i] = dataclasses.replace(out[i], **changes)
    return out


def _mutations(sets):
    train, detect, ev, val = (sets[n] for n in HOP)
    t0, d0, e0, v0 = train[0], detect[0], ev[0], val[0]
    test0 = next(iter(t0.tests.values()))
    literal = {**e0.questions, "onehop": e0.needle.replace("{CHAR}", "Which character")
               .rstrip(".") + "?"}
    return {
        "onehop shares": {"hop_eval": _swap(ev, 0, questions=literal)},
        "needle templates from training": {"hop_detect": _swap(detect, 0, needle=t0.needle)},
        "question templates from training": {"hop_detect": _swap(
            detect, 0, questions={**d0.questions, "onehop": t0.questions["onehop"]})},
        "slot values from training": {"hop_detect": _swap(detect, 0, tests={
            **d0.tests, "T01": dataclasses.replace(d0.tests["T01"],
                                                   input_args=test0.input_args)})},
        "shared character names": {"hop_eval": _swap(
            ev, 0, character_set=(t0.character_set[0], *e0.character_set[1:]))},
        "link kinds from training": {"hop_eval": _swap(ev, 0, reasoning_type=t0.reasoning_type)},
        "shared entry ids": {"hop_detect": _swap(detect, 0, id=t0.id)},
        "shared filled needles": {"hop_eval": _swap(ev, 0, needle=t0.needle, tests=t0.tests)},
        "entries <": {"hop_eval": ev[:39]},
        "link kinds < 10": {"hop_train": [e for e in train
                                          if e.reasoning_type in list(_kinds(train))[:9]]},
        "hop_val: link kinds from another set": {"hop_val": _swap(
            val, 0, reasoning_type=e0.reasoning_type)},
        "hop_val: slot values from another set": {"hop_val": _swap(val, 0, tests={
            **v0.tests, "T01": dataclasses.replace(v0.tests["T01"],
                                                   input_args=test0.input_args)})},
        "link kinds < 4": {"hop_val": [e for e in val
                                       if e.reasoning_type in list(_kinds(val))[:3]]},
    }


@pytest.mark.parametrize("rule", [
    "onehop shares", "needle templates from training", "question templates from training",
    "slot values from training", "shared character names", "link kinds from training",
    "shared entry ids", "shared filled needles", "entries <", "link kinds < 10",
    "hop_val: link kinds from another set", "hop_val: slot values from another set",
    "link kinds < 4"])
def test_a_broken_rule_is_reported(sets, rule):
    mutated = {**sets, **_mutations(sets)[rule]}
    found = violations(mutated)
    assert any(rule in v for v in found), found


def test_a_shared_question_with_everyday_is_reported(sets):
    day = sets["everyday"][0]
    ev = sets["hop_eval"]
    e0 = ev[0]
    # the everyday onehop question has no slot: copying it copies the filled question
    copied = _swap(ev, 0, questions={**e0.questions, "direct": day.questions["onehop"]})
    found = violations({**sets, "hop_eval": copied})
    assert any("hop_eval/everyday: shared questions" in v for v in found), found
