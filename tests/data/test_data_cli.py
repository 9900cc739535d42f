"""``locos build-trials`` end to end through typer's CliRunner."""

from __future__ import annotations

import json

import pytest
from trialdata_helpers import NIAH_FILE, get_tokenizer
from typer.testing import CliRunner

from locos_tl.cli import app
from locos_tl.trials import load_trials


@pytest.fixture(scope="module", params=["bytelevel", "metaspace"])
def tok_dir(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"tok_{request.param}")
    get_tokenizer(request.param).save_pretrained(d)
    return d


def test_build_nolima(tok_dir, needle_set_file, shared_books, tmp_path):
    out = tmp_path / "trials.jsonl"
    args = ["build-trials", "nolima", "--needle-set", str(needle_set_file),
            "--haystack", str(shared_books[0]), "--haystack", str(shared_books[1]),
            "--tokenizer", str(tok_dir), "--lengths", "300,700", "--depths", "0,50,100",
            "--num-examples", "9", "--question-type", "onehop", "--chat-template",
            "--seed", "5", "--out", str(out)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "wrote 9 nolima trials" in res.output
    trials = load_trials(out)
    assert len(trials) == 9
    for t in trials:
        assert len(t.tokens) == t.meta["length"] in (300, 700)
        assert t.meta["question_type"] == "onehop" and t.meta["chat_template"] is True
        assert t.meta["haystack_index"] in (0, 1) and t.prompt and t.answer == t.meta["character"]
    meta = json.loads((tmp_path / "trials.jsonl.meta.json").read_text())
    assert meta["n_trials"] == 9 and meta["args"]["seed"] == 5
    again = tmp_path / "again.jsonl"
    assert CliRunner().invoke(app, args[:-1] + [str(again)]).exit_code == 0
    assert out.read_text() == again.read_text()


def test_build_niah(tok_dir, shared_books, tmp_path):
    out = tmp_path / "niah.jsonl"
    res = CliRunner().invoke(app, [
        "build-trials", "niah", "--needles", str(NIAH_FILE),
        "--haystack", str(shared_books[0].parent), "--tokenizer", str(tok_dir),
        "--lengths", "linspace:400:800:2", "--depths", "linspace:0:100:2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    trials = load_trials(out)
    assert len(trials) == 3 * len(shared_books) * 2 * 2
    assert {t.meta["length"] for t in trials} == {400, 800}
    assert all(len(t.tokens) == t.meta["length"] for t in trials)
    # without --needles and --haystack: the probes and books shipped with locos_tl
    again = tmp_path / "again.jsonl"
    res = CliRunner().invoke(app, [
        "build-trials", "niah", "--tokenizer", str(tok_dir), "--lengths",
        "linspace:400:800:2", "--depths", "linspace:0:100:2", "--out", str(again)])
    assert res.exit_code == 0, res.output
    assert [t.trial_id for t in load_trials(again)] == [t.trial_id for t in trials]


def test_cli_errors_are_clean(tok_dir, needle_set_file, shared_books, tmp_path):
    base = ["build-trials", "nolima", "--haystack", str(shared_books[0]),
            "--tokenizer", str(tok_dir), "--depths", "50", "--out", str(tmp_path / "o.jsonl")]
    res = CliRunner().invoke(app, base + ["--needle-set", str(needle_set_file),
                                          "--lengths", "200000"])
    assert res.exit_code == 2 and "too short" in res.output and "tokens" in res.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"id": "0101", "needle": "no char here"}]))
    res = CliRunner().invoke(app, base + ["--needle-set", str(bad), "--lengths", "500"])
    assert res.exit_code == 2 and "entry '0101'" in res.output
    assert not (tmp_path / "o.jsonl").exists()
