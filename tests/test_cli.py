"""The `locos score` command writes the run directory and fails cleanly on bad input."""

import json

import pandas as pd
from typer.testing import CliRunner

from locos_tl import save_trials
from locos_tl.cli import app

runner = CliRunner()


def test_score_writes_all_outputs(tiny_dirs, own_answer_trials, tmp_path):
    trials = save_trials(own_answer_trials, tmp_path / "trials.jsonl")
    out = tmp_path / "run"
    res = runner.invoke(app, ["score", "--model", str(tiny_dirs["qwen3"]), "--trials", str(trials),
                              "--out", str(out), "--max-new-tokens", "8", "--variant", "exact"])
    assert res.exit_code == 0, res.output
    for f in ("scores.csv", "trials.jsonl", "meta.json", "locos/scores.csv", "locos/heads.json",
              "locos/head_scores.json", "locos/heatmap.html"):  # one layout (locos_tl.runs.rundir)
        assert (out / f).exists(), f
    df = pd.read_csv(out / "scores.csv")
    assert len(df) == 2 * 4 and set(df["variant"]) == {"exact"} and set(df["n_trials"]) == {3}
    assert "L" in res.output and "top 10 heads (3 of 3 trials accepted)" in res.output
    html = (out / "locos" / "heatmap.html").read_text()
    # RdBu (red to blue, centred at 0), written out: plotly.js is no longer inlined
    assert "rgb(103,0,31)" in html and "rgb(5,48,97)" in html
    assert "L%{" not in html and "Layer" in html
    assert len(json.loads((out / "locos" / "heads.json").read_text())["0-0"]) == 3


def test_score_several_methods(tiny_dirs, own_answer_trials, tmp_path):
    trials = save_trials(own_answer_trials[:1], tmp_path / "trials.jsonl")
    out = tmp_path / "run"
    res = runner.invoke(app, ["score", "--model", str(tiny_dirs["qwen3"]), "--trials", str(trials),
                              "--out", str(out), "--max-new-tokens", "8", "--method", "locos,wu"])
    assert res.exit_code == 0, res.output
    assert (out / "locos" / "heatmap.html").exists() and (out / "wu" / "heads.json").exists()
    assert set(pd.read_csv(out / "scores.csv")["method"]) == {"locos", "wu"}


def test_score_text_records_and_errors(tiny_dirs, tmp_path):
    trials = tmp_path / "t.jsonl"
    trials.write_text(json.dumps({"prompt": "The old man reads a book by the window.",
                                  "needle": "a book", "answer": "book"}) + "\n")
    out = tmp_path / "run"
    ok = runner.invoke(app, ["score", "--model", str(tiny_dirs["qwen3"]), "--trials", str(trials),
                             "--out", str(out), "--max-new-tokens", "4"])
    # the random tiny model does not answer "book": the text record was tokenized and
    # scored (its record is kept), and a run without an accepted trial is an error
    assert ok.exit_code == 2 and "no trial was accepted: 0 of 1" in ok.output, ok.output
    assert json.loads((out / "trials.jsonl").read_text().splitlines()[0])["needle_span"]
    bad = runner.invoke(app, ["score", "--model", str(tmp_path / "nope"), "--trials", str(trials),
                              "--out", str(out)])
    assert bad.exit_code == 2 and "does not exist" in bad.output
    trials.write_text(json.dumps({"prompt": "abc", "needle": "xyz", "answer": "a"}) + "\n")
    bad = runner.invoke(app, ["score", "--model", str(tiny_dirs["qwen3"]), "--trials", str(trials),
                              "--out", str(tmp_path / "r2")])
    assert bad.exit_code == 2 and "not found in the prompt" in bad.output


def test_method_choices_and_help_are_the_registry(tmp_path):
    """``locos score --method`` accepts exactly the registry's names, lists them when it
    refuses one, and its help names each (decode pass, then own passes)."""
    from locos_tl.cli._common import method_choices
    from locos_tl.experiments.methods import METHODS

    assert method_choices() == tuple(METHODS)
    trials = tmp_path / "t.jsonl"
    trials.write_text(json.dumps({"prompt": "abc", "needle": "b", "answer": "b"}) + "\n")
    bad = runner.invoke(app, ["score", "--model", str(tmp_path / "m"), "--trials", str(trials),
                              "--out", str(tmp_path / "run"), "--method", "locos,nope"])
    assert bad.exit_code == 2
    assert f"'nope' is not one of {', '.join(METHODS)}" in " ".join(bad.output.split())
    shown = " ".join(runner.invoke(app, ["score", "--help"]).output.split())
    assert ("locos, wu, attention_spatial, headkv, headkv_anchor, dla share one decode pass; "
            "atp, qrhead, cri run their own forward passes") in shown
