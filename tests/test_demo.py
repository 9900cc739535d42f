"""`locos demo` on the shipped organism: outputs written, LOCOS finds the documented
non-literal writers, the Wu copy score does not."""

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from locos_tl.cli import app
from locos_tl.organisms import DEFAULT_ORGANISM, default_book_dir


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    res = CliRunner().invoke(app, ["demo", "--out", str(out), "--n-trials", "8"])
    assert res.exit_code == 0, res.output
    return out, res.output


def test_demo_writes_score_outputs_per_run(demo_out):
    out, text = demo_out
    runs = ["nonliteral_synthetic", "literal_synthetic"]
    if default_book_dir().exists():
        runs += ["nonliteral_book", "literal_book"]
    for run in runs:
        for method in ("locos", "wu"):
            for f in ("scores.csv", "heads.json", "heatmap.html"):
                assert (out / run / method / f).exists(), (run, method, f)
        assert (out / run / "trials.jsonl").exists() and (out / run / "meta.json").exists()
        assert f"== {run}: 8/8 trials answered correctly" in text
    assert "rank" in text and "non-literal writer" in text


def test_demo_rankings_match_ground_truth(demo_out):
    out, _ = demo_out
    gt = json.loads((Path(DEFAULT_ORGANISM) / "ground_truth.json").read_text())
    writers = {f"L{l}H{h}" for l, h in gt["nonliteral_writer"]}
    copies = {f"L{l}H{h}" for l, h in gt["literal_copy"]}
    df = pd.read_csv(out / "rankings.csv")
    nl = df[df["run"] == "nonliteral_synthetic"]
    assert set(nl["locos head"].iloc[:2]) == writers
    wu_positive = nl[nl["wu score"] > 0]["wu head"]
    assert not writers & set(wu_positive)  # the copy score cannot see the writers
    lit = df[df["run"] == "literal_synthetic"]
    assert set(lit["locos head"].iloc[:4]) == copies


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
