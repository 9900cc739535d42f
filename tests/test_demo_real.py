"""``locos demo --model smollm2-135m-instruct`` at a tiny size: the real-model demo's
run directories, tables and rankings.

Skips when the model is not fetched (``locos models fetch smollm2-135m-instruct``), and
fails instead when ``LOCOS_REQUIRE_REAL_MODELS=1`` (CI).
"""

from __future__ import annotations

import json
import os
import re

import pandas as pd
import pytest
from typer.testing import CliRunner

from locos_tl.cli import app

MODEL = "smollm2-135m-instruct"
N, LENGTH = 2, 160


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    from locos_tl.models.zoo import get_real_model

    if not get_real_model(MODEL).prepared:
        msg = f"{MODEL} is not fetched (run `locos models fetch {MODEL}`)"
        if os.environ.get("LOCOS_REQUIRE_REAL_MODELS") == "1":
            pytest.fail(f"{msg}, and LOCOS_REQUIRE_REAL_MODELS=1")
        pytest.skip(msg)
    out = tmp_path_factory.mktemp("demo_real")
    res = CliRunner().invoke(app, ["demo", "--model", MODEL, "--out", str(out),
                                   "--n-trials", str(N), "--length", str(LENGTH)])
    assert res.exit_code == 0, res.output
    return out, res.output


def test_runs_written_like_locos_score(demo_run):
    out, text = demo_run
    assert (out / "plotly.min.js").is_file() and (out / "rankings.csv").is_file()
    for run in ("direct", "onehop"):
        for method in ("locos", "wu"):
            for f in ("scores.csv", "heads.json", "heatmap.html"):
                assert (out / run / method / f).is_file(), (run, method, f)
        records = [json.loads(line) for line in (out / run / "trials.jsonl").open()]
        assert len(records) == N and (out / run / "meta.json").is_file()
    assert "30 x 9 (3) heads" in text and f"prompts of {LENGTH} tokens" in text
    for label in ("literal (direct)", "non-literal (onehop)"):
        assert re.search(rf"== {re.escape(label)}: \d/{N} answered", text), text
    assert re.search(r"top-10 overlap: LOCOS literal vs non-literal \d+/10", text)


def test_printed_ranking_is_the_score_files(demo_run):
    """The printed top heads are the highest scores of each run's ``scores.csv``
    (270 heads, one row each)."""
    out, _ = demo_run
    table = pd.read_csv(out / "rankings.csv")
    for run in ("direct", "onehop"):
        scores = pd.read_csv(out / run / "locos" / "scores.csv")
        assert len(scores) == 30 * 9
        listed = table[table.run == run]["locos head"].dropna()
        listed = [h for h in listed if h != "-"]
        if not listed:  # no trial answered: nothing ranked, every score 0
            assert (scores.score.fillna(0) == 0).all()
            continue
        best = scores.sort_values("score", ascending=False).head(len(listed))
        assert listed == [f"L{l}H{h}" for l, h in zip(best["layer"], best["head"], strict=True)]


def test_demo_trials_are_the_everyday_set(demo_run):
    out, _ = demo_run
    from locos_tl.data import load_needle_set

    sets = {e.id: e for e in load_needle_set("everyday")}
    pairs: dict[str, list[tuple[str, str]]] = {}
    for run in ("direct", "onehop"):
        for line in (out / run / "trials.jsonl").open():
            meta = json.loads(line)["meta"]
            assert meta["entry_id"] in sets and meta["question_type"] == run
            assert meta["haystack"] == "everyday_prose.txt"
            pairs.setdefault(run, []).append((meta["entry_id"], meta["test_id"]))
    assert sorted(pairs["direct"]) == sorted(pairs["onehop"])  # each needle asked both ways
    assert len(set(pairs["direct"])) == N
