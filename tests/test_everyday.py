"""The shipped ``everyday`` needle set: schema, literal / non-literal questions, name
resolution, the completion template, and ``locos build-trials nolima --needle-set
everyday``."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from locos_tl.cli import app
from locos_tl.cli.demo_real import DEFAULT_HAYSTACK
from locos_tl.data import build_nolima_trials, expand_needle_set, load_haystack, load_needle_set
from locos_tl.data.needle_sets import content_words, lexical_overlaps, shared_content_words
from locos_tl.data.nolima import (
    COMPLETION_TASK_TEMPLATE,
    NEEDLE_SETS_DIR,
    parse_needle_set,
    resolve_needle_set,
    shipped_needle_sets,
)
from locos_tl.errors import DataFormatError
from locos_tl.trials import load_trials

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")


@pytest.fixture(scope="module")
def entries():
    return load_needle_set("everyday")


@pytest.fixture(scope="module")
def tok():
    """A byte-level BPE tokenizer trained on the shipped haystack and needles, with a
    ChatML chat template."""
    from locos_tl.models.tiny import byte_bpe_tokenizer

    text = DEFAULT_HAYSTACK.read_text() + (NEEDLE_SETS_DIR / "everyday.json").read_text()
    t = byte_bpe_tokenizer(vocab_size=600, text=text)
    t.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    t.chat_template = CHAT_TEMPLATE
    return t


# ------------------------------------------------------------------- the set itself
def test_shipped_set_schema(entries):
    raw = json.loads((NEEDLE_SETS_DIR / "everyday.json").read_text(encoding="utf-8"))
    assert [e.id for e in parse_needle_set(raw)] == [e.id for e in entries]
    assert len(entries) >= 20
    names: set[str] = set()
    for e in entries:
        assert len(e.tests) >= 4, e.id
        assert set(e.questions) == {"direct", "onehop"}, e.id
        assert e.needle.count("{CHAR}") == 1 and "{CHAR}" not in "".join(e.questions.values())
        assert all(not t.gold_answers for t in e.tests.values())  # the answer is the name
        assert all(q.startswith("Which character") for q in e.questions.values()), e.id
        # every test fills the needle differently
        assert len({t.input_args for t in e.tests.values()}) == len(e.tests), e.id
        names |= set(e.character_set)
    assert len(names) >= 20
    # varied: names from many traditions, not one alphabet of English first names
    assert {"Yuki", "Arjun", "Kwame", "Zainab", "Ingrid", "Mateo"} <= names


def test_onehop_is_non_literal_and_direct_is_literal(entries):
    assert lexical_overlaps(entries, "onehop") == []
    for it in expand_needle_set(entries, ["direct"]):
        needle = it.needle.replace("{CHAR}", " ")
        shared = shared_content_words(needle, it.question)
        # the direct question repeats most of the needle's content words
        assert len(shared) >= 0.6 * len(content_words(needle)), (it.entry_id, it.test_id)


def test_items_realise_the_character_as_answer(entries):
    item = expand_needle_set(entries, ["onehop"])[0]
    needle, question, answer = item.realise("Kwame")
    assert answer == "Kwame" and "Kwame" in needle and "Kwame" not in question


# ------------------------------------------------------------------ lexical check
@pytest.mark.parametrize(("needle", "question", "shared"), [
    ("Yuki has a dog called Biscuit.", "Which character owns a pet?", set()),
    ("The dog called Biscuit belongs to Yuki.", "Which character has two dogs?", {"dog"}),
    ("Yuki keeps a farm in the hills.", "Which character is a farmer?", {"farmer"}),
    ("Yuki bakes bread.", "Which character works in a bakery?", {"bakeri"}),
    ("The cat is on the mat.", "Which one is it, and where?", set()),  # stopwords only
    ("Yuki painted the kitchen.", "Which character is painting?", {"paint"}),
    ("Yuki has a cat.", "Which character keeps cattle?", set()),  # 3-letter stems: no prefix rule
])
def test_shared_content_words(needle, question, shared):
    assert shared_content_words(needle, question, ignore=["Yuki"]) == shared


def test_content_words_drop_names_and_stopwords():
    assert content_words("Yuki's dogs were at the Mill Road.", ignore=["Yuki"]) == {
        "dog", "mill", "road"}


def test_lexical_overlaps_reports_a_literal_onehop():
    bad = parse_needle_set([{
        "id": "0001", "needle": "{CHAR} has a dog called {1}.",
        "questions": {"onehop": "Which character has a dog?"},
        "character_set": ["Yuki"], "tests": {"T01": {"input_args": ["Rex"]},
                                             "T02": {"input_args": ["Pip"]}},
    }])
    assert lexical_overlaps(bad) == [("0001", "T01", {"dog"}), ("0001", "T02", {"dog"})]


# ------------------------------------------------------------------- name resolution
def test_resolve_shipped_name_and_paths(tmp_path):
    assert "everyday" in shipped_needle_sets()
    assert resolve_needle_set("everyday") == NEEDLE_SETS_DIR / "everyday.json"
    own = tmp_path / "everyday"  # a file of that name wins over the shipped set
    own.write_text(json.dumps([{"id": "0009", "needle": "{CHAR} sings.",
                                "questions": {"onehop": "Who makes music?"},
                                "character_set": ["Ana"],
                                "tests": {"T01": {"input_args": []}}}]))
    assert [e.id for e in load_needle_set(own)] == ["0009"]
    with pytest.raises(DataFormatError, match=r"'?nope'? does not exist.*shipped: everyday"):
        load_needle_set("nope")
    with pytest.raises(DataFormatError, match="does not exist"):
        load_needle_set(tmp_path / "missing.json")


# ---------------------------------------------------------------------- templates
def _check_needle(trial, tok):
    s, e = trial.needle_span
    text = tok.decode(list(trial.tokens[s:e]))
    assert text.strip() == trial.meta["needle"], (text, trial.meta["needle"])
    assert trial.meta["character"] in text


def test_completion_template_prompts(entries, tok):
    hay = load_haystack(DEFAULT_HAYSTACK)
    items = expand_needle_set(entries[:3], ["direct", "onehop"])
    trials = build_nolima_trials(tok, items, [hay], lengths=[400], depths=[0, 50, 100],
                                 template="completion")
    assert len(trials) == len(items) * 3
    pre, post = COMPLETION_TASK_TEMPLATE.split("{haystack}")
    for t in trials:
        assert len(t.tokens) == 400 and t.meta["template"] == "completion"
        assert t.prompt.startswith(pre)
        assert t.prompt.endswith(post.replace("{question}", t.meta["question"]))
        assert t.prompt.endswith("\nAnswer: The character's name is")
        _check_needle(t, tok)
        # the needle sits inside the haystack part, before the question
        start = t.prompt.index(t.meta["needle"])
        assert len(pre) <= start < t.prompt.index("\n\nQuestion: ")


def test_default_template_is_chat_style(entries, tok):
    hay = load_haystack(DEFAULT_HAYSTACK)
    items = expand_needle_set(entries[3:5], ["onehop"])
    trials = build_nolima_trials(tok, items, [hay], lengths=[500], depths=[50],
                                 chat_template=True)
    for t in trials:
        assert len(t.tokens) == 500 and t.meta["template"] == "default"
        assert t.prompt.startswith("<|im_start|>user\n")
        assert t.prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
        assert t.meta["question"] in t.prompt
        _check_needle(t, tok)


def test_unknown_template_is_refused(entries, tok):
    hay = load_haystack(DEFAULT_HAYSTACK)
    with pytest.raises(DataFormatError, match="unknown task template 'base'.*completion"):
        build_nolima_trials(tok, expand_needle_set(entries[:1]), [hay], lengths=[300],
                            depths=[50], template="base")


# ----------------------------------------------------------------------------- CLI
def test_cli_build_trials_everyday(tok, tmp_path):
    tok_dir = tmp_path / "tok"
    tok.save_pretrained(tok_dir)
    out = tmp_path / "everyday.jsonl"
    args = ["build-trials", "nolima", "--needle-set", "everyday",
            "--haystack", str(DEFAULT_HAYSTACK), "--tokenizer", str(tok_dir),
            "--lengths", "350", "--depths", "25,75", "--num-examples", "8",
            "--question-type", "onehop", "--template", "completion", "--out", str(out)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    trials = load_trials(out)
    ids = {e.id for e in load_needle_set("everyday")}
    assert len(trials) == 8
    for t in trials:
        assert t.meta["entry_id"] in ids and t.meta["question_type"] == "onehop"
        assert len(t.tokens) == 350 and t.prompt.endswith("Answer: The character's name is")
    meta = json.loads((tmp_path / "everyday.jsonl.meta.json").read_text())
    assert meta["args"]["needle_set"] == "everyday" and meta["args"]["template"] == "completion"


def test_cli_unknown_set_and_template(tok, tmp_path):
    tok_dir = tmp_path / "tok"
    tok.save_pretrained(tok_dir)
    base = ["build-trials", "nolima", "--haystack", str(DEFAULT_HAYSTACK),
            "--tokenizer", str(tok_dir), "--lengths", "300", "--out", str(tmp_path / "o.jsonl")]
    res = CliRunner().invoke(app, base + ["--needle-set", "weekday"])
    assert res.exit_code == 2
    assert re.search(r"weekday does not exist.*shipped: everyday", " ".join(res.output.split()))
    res = CliRunner().invoke(app, base + ["--needle-set", "everyday", "--template", "base"])
    assert res.exit_code == 2 and "unknown --template 'base'" in res.output
    assert not (tmp_path / "o.jsonl").exists()


def test_shipped_haystack_has_no_names():
    """The demo's haystack names nobody, so the needle's character is its only person."""
    text = DEFAULT_HAYSTACK.read_text(encoding="utf-8")
    assert 2300 <= len(text.split()) <= 3000
    names = {n for e in load_needle_set("everyday") for n in e.character_set}
    assert not [n for n in names if re.search(rf"\b{n}\b", text)]


def test_shipped_files_are_package_data():
    """A wheel carries the needle set and the haystack (pyproject package-data)."""
    import tomllib
    from fnmatch import fnmatch
    from pathlib import Path

    import locos_tl

    root = Path(locos_tl.__file__).resolve().parents[1]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["locos_tl"]
    pkg = Path(locos_tl.__file__).resolve().parent
    for f in (*NEEDLE_SETS_DIR.glob("*.json"), DEFAULT_HAYSTACK):
        rel = f.resolve().relative_to(pkg).as_posix()
        assert any(fnmatch(rel, p) for p in patterns), rel
