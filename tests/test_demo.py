"""`locos demo` on the shipped long-context organism at its default 1024 tokens: outputs
written, LOCOS finds the documented non-literal writers, the Wu copy score does not; an
organism run beyond its valid range is warned about."""

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from locos_tl.cli import app
from locos_tl.organisms import LONG_ORGANISM


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    res = CliRunner().invoke(app, ["demo", "--out", str(out), "--n-trials", "8"])
    assert res.exit_code == 0, res.output
    return out, res.output


def test_demo_writes_score_outputs_per_run(demo_out):
    out, text = demo_out
    runs = ["nonliteral_synthetic", "literal_synthetic", "nonliteral_book", "literal_book"]
    for run in runs:
        for method in ("locos", "wu"):
            for f in ("scores.csv", "heads.json", "heatmap.html"):
                assert (out / run / method / f).exists(), (run, method, f)
        assert (out / run / "trials.jsonl").exists() and (out / run / "meta.json").exists()
        m = re.search(rf"== {run}: (\d+)/8 trials answered correctly", text)
        assert m and int(m.group(1)) >= 7, (run, text)
    assert "rank" in text and "non-literal writer" in text


def test_demo_rankings_match_ground_truth(demo_out):
    out, text = demo_out
    assert "organism retrieval-long, prompts of 1024 tokens, 8 trials" in text
    gt = json.loads((Path(LONG_ORGANISM) / "ground_truth.json").read_text())
    writers = {f"L{l}H{h}" for l, h in gt["nonliteral_writer"]}
    copies = {f"L{l}H{h}" for l, h in gt["literal_copy"]}
    df = pd.read_csv(out / "rankings.csv")
    nl = df[df["run"] == "nonliteral_synthetic"]
    top = set(nl["locos head"].iloc[:len(writers)])
    assert len(top & writers) >= len(writers) - 1, (top, writers)
    wu_positive = nl[nl["wu score"] > 0]["wu head"]
    assert not writers & set(wu_positive)  # the copy score cannot see the writers
    lit = df[df["run"] == "literal_synthetic"]
    top_lit = set(lit["locos head"].iloc[:min(len(copies), 5)])
    assert len(top_lit & copies) >= min(len(copies), 5) - 1, (top_lit, copies)


def test_demo_warns_beyond_the_valid_range(tmp_path):
    res = CliRunner().invoke(app, ["demo", "--model", "retrieval-2l", "--length", "512",
                                   "--n-trials", "1", "--out", str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    assert "retrieves reliably only up to 128 tokens" in res.output


def test_demo_summary_names_files_where_they_are(demo_out):
    out, text = demo_out
    summary = text[text.index(f"wrote {out}/:"):]
    top, per_run, per_method = (line.rstrip(";").split(": ", 1) for line in
                                summary.splitlines()[:3])
    runs = re.findall(r"(\w+)/", per_run[0])
    methods = re.findall(r"<run>/(\w+)/", per_method[0])
    assert len(runs) >= 2 and methods == ["locos", "wu"]
    for name in top[1].split(", "):
        assert (out / name).is_file(), name
    for run in runs:
        for name in per_run[1].split(", "):
            assert (out / run / name).is_file(), (run, name)
        for method in methods:
            for name in per_method[1].split(", "):
                assert (out / run / method / name).is_file(), (run, method, name)
    assert "heatmap.html" in per_method[1] and "heatmap.html" not in per_run[1]
    assert "plotly.min.js" in top[1] and not list(out.glob("*/**/plotly.min.js"))
