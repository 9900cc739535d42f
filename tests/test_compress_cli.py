"""``locos compress`` on the shipped organism (96-128 tokens, its valid range): the files
it writes, its numbers against a direct ``compression_sweep`` call, resuming, and bad
inputs refused before the model loads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from tolerances import EPS64, sum_tol
from typer.testing import CliRunner

from locos_tl import save_trials, score_methods
from locos_tl.cli import app
from locos_tl.organisms import SMALL_ORGANISM, make_trials

runner = CliRunner()
FRACTIONS = (0.1, 0.25, 0.5, 1.0)
METHODS = ("locos", "wu", "headkv")


@pytest.fixture(scope="module")
def setup(organism, tmp_path_factory):
    """A three-method scoring run and literal / non-literal trial files."""
    tmp = tmp_path_factory.mktemp("compress")
    detect = [t for task in ("literal", "nonliteral")
              for t in make_trials(task, 6, n_tokens=[96, 128], seed=21)]
    scores = score_methods(organism, detect, methods=list(METHODS), max_new_tokens=3,
                           out_dir=tmp / "scores", progress=False)
    evals = {task: make_trials(task, 3, n_tokens=[96, 128], seed=22)
             for task in ("literal", "nonliteral")}
    files = {task: save_trials(ts, tmp / f"{task}.jsonl") for task, ts in evals.items()}
    return {"tmp": tmp, "scores": scores, "evals": evals, "files": files}


def _args(setup, out: Path, *extra: str) -> list[str]:
    return ["compress", "--model", SMALL_ORGANISM, "--heads", str(setup["tmp"] / "scores"),
            "--trials", str(setup["files"]["literal"]),
            "--trials", str(setup["files"]["nonliteral"]),
            "--fractions", ",".join(map(str, FRACTIONS)), "--out", str(out), *extra]


@pytest.mark.filterwarnings("ignore:.*below the floor")
def test_compress_writes_the_sweep_of_the_api(organism, setup):
    from locos_tl.experiments.compress import compression_sweep

    out = setup["tmp"] / "run"
    res = runner.invoke(app, _args(setup, out, "--device", "cpu"))
    assert res.exit_code == 0, res.output
    for name in ("compression.csv", "meta.json", "compression.html", "plotly.min.js"):
        assert (out / name).is_file(), name
    csv = pd.read_csv(out / "compression.csv", dtype={"trial": str})
    trials = setup["evals"]["literal"] + setup["evals"]["nonliteral"]
    s = setup["scores"]
    direct = compression_sweep(
        organism, trials, {"locos": s["locos"], "wu": s["wu"],
                           "headkv": (s["headkv"], "proportional")},
        FRACTIONS, unit="kv_group", include=("uniform", "random"), seed=0, progress=False)
    n_rankings = len(METHODS) + 2
    assert len(csv) == len(direct) == len(trials) * n_rankings * len(FRACTIONS)
    keys = ["ranking", "fraction", "trial"]
    a = csv.sort_values(keys).reset_index(drop=True)
    b = direct.sort_values(keys).reset_index(drop=True)
    for col in ("ranking", "allocation", "unit", "task", "trial", "answer", "context_len",
                "kv_bytes", "full_kv_bytes", "retained_entries", "full_entries",
                "trial_index"):
        assert a[col].tolist() == b[col].tolist(), col
    assert a["correct"].astype(bool).tolist() == b["correct"].astype(bool).tolist()
    assert a["output"].fillna("").astype(str).tolist() == b["output"].astype(str).tolist()
    assert a["retained_fraction"].tolist() == pytest.approx(b["retained_fraction"].tolist())
    assert set(a.loc[a.ranking == "headkv", "allocation"]) == {"proportional"}
    assert set(a.loc[a.ranking == "locos", "allocation"]) == {"greedy"}
    # the full cache keeps every entry and every byte
    full = a[a.fraction == 1.0]
    assert (full.kv_bytes == full.full_kv_bytes).all()
    assert (full.retained_entries == full.full_entries).all()

    meta = json.loads((out / "meta.json").read_text())
    assert meta["settings"]["fractions"] == list(FRACTIONS)
    assert set(meta["settings"]["rankings"]) == set(METHODS)
    assert meta["model"]["n_key_value_heads"] == 2
    # the printed table: accuracy per ranking x fraction x task, from the CSV
    text = res.output
    assert "first token literal" in text and "first token nonliteral" in text
    # fraction 0.1 of ~100 context tokens is below the 4 + 8 floor: one note says so
    assert text.count("below the sinks + recent floor") == 1
    assert "note: fractions [0.1] fell below" in text
    acc = a[(a.ranking == "wu") & (a.fraction == 0.25)].groupby("task")["correct"].mean()
    row = next(line for line in text.splitlines()
               if re.match(r"\s*wu\s+greedy\s+0\.25", line))
    assert [float(x) for x in row.split()[3:5]] == pytest.approx(  # printed with 3 decimals
        [acc["literal"], acc["nonliteral"]], abs=5e-4)
    word = (a[(a.ranking == "wu") & (a.fraction == 0.25)].groupby("task")
            ["answer_correct"].mean())
    assert "word match literal" in text and "word match nonliteral" in text
    assert "contains" not in text  # NoLiMa's substring test is not what is printed
    assert [float(x) for x in row.split()[5:7]] == pytest.approx(
        [word["literal"], word["nonliteral"]], abs=5e-4)
    assert "accuracy (first answer token)" in (out / "compression.html").read_text()
    assert "accuracy (answer as a whole word)" not in (out / "compression.html").read_text()

    # progress is a tqdm bar over the trials, as in every other command
    assert re.search(rf"compressing: 100%.*{len(trials)}/{len(trials)}", text)
    assert not re.search(r"\d+/\d+ trials", text)

    # a rerun resumes: nothing is recomputed, the rows stay
    again = runner.invoke(app, _args(setup, out, "--score", "word-match"))
    assert again.exit_code == 0, again.output
    assert f"skipping {len(trials)} of {len(trials)}" in again.output
    assert len(pd.read_csv(out / "compression.csv")) == len(csv)
    # --score picks what the figure plots, not a setting of the run
    assert "accuracy (answer as a whole word)" in (out / "compression.html").read_text()
    for gone in ("rouge", "contains"):
        bad = runner.invoke(app, _args(setup, out, "--score", gone))
        assert bad.exit_code == 2
        assert f"'{gone}' is not one of first-token, word-match" in bad.output
    # other settings in the same directory are refused
    other = runner.invoke(app, [*_args(setup, out), "--unit", "query_head"])
    assert other.exit_code == 2
    assert "other settings (unit)" in " ".join(other.output.split())


def test_compress_resumes_an_interrupted_run(setup):
    """Rows of the finished trials are kept; only the missing trial is computed."""
    out = setup["tmp"] / "partial"
    args = _args(setup, out, "--heads", str(setup["tmp"] / "scores" / "locos"),
                 "--include", "none")
    args[args.index("--heads") + 1] = str(setup["tmp"] / "scores" / "wu")
    assert runner.invoke(app, args).exit_code == 0
    csv = pd.read_csv(out / "compression.csv", dtype={"trial": str})
    assert set(csv.ranking) == {"wu", "locos"}
    last = csv.trial.iloc[-1]
    csv[csv.trial != last].to_csv(out / "compression.csv", index=False)  # "interrupted"
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "skipping 5 of 6" in res.output
    again = pd.read_csv(out / "compression.csv", dtype={"trial": str})
    pd.testing.assert_frame_equal(again.sort_values(["trial", "ranking", "fraction"])
                                  .reset_index(drop=True),
                                  csv.sort_values(["trial", "ranking", "fraction"])
                                  .reset_index(drop=True))


@pytest.fixture
def no_model_load(monkeypatch):
    import locos_tl.models.load

    calls = []

    def load_model(*args, **kwargs):
        calls.append(args)
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(locos_tl.models.load, "load_model", load_model)
    return calls


def test_compress_resume_refuses_another_dtype(setup, tmp_path, monkeypatch):
    """A float32 run resumed with --dtype bfloat16 is refused before the
    model loads, as `locos score` refuses it; so is a run recorded before dtype was a
    setting (its provenance says float32)."""
    import locos_tl.models.load

    out = tmp_path / "run"
    args = _args(setup, out, "--heads", str(setup["tmp"] / "scores" / "wu"),
                 "--include", "none", "--fractions", "1")
    args[args.index("--heads") + 1] = str(setup["tmp"] / "scores" / "locos")
    assert runner.invoke(app, args).exit_code == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["settings"]["dtype"] == meta["model"]["dtype"] == "float32"
    csv = (out / "compression.csv").read_text()

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the run directory was checked")

    monkeypatch.setattr(locos_tl.models.load, "load_model", no_load)
    for old_meta in (meta, {**meta, "settings": {k: v for k, v in meta["settings"].items()
                                                  if k != "dtype"}}):
        (out / "meta.json").write_text(json.dumps(old_meta))
        res = runner.invoke(app, [*args, "--dtype", "bfloat16"])
        assert res.exit_code == 2, res.output
        assert "other settings (dtype)" in " ".join(res.output.split())
        assert (out / "compression.csv").read_text() == csv
    monkeypatch.undo()
    same = runner.invoke(app, [*args, "--dtype", "fp32"])  # the same dtype, another name
    assert same.exit_code == 0, same.output
    assert "skipping 6 of 6" in same.output


@pytest.mark.parametrize("extra, message", [
    (["--unit", "kv_head"], r"Invalid value for '--unit': 'kv_head' is not one of kv_group, "
                            r"query_head"),
    (["--fractions", "0.1,0"], r"Invalid value for '--fractions': 0 is outside \(0, 1\]"),
    (["--fractions", "0.5,1.5"], r"'--fractions': 1.5 is outside \(0, 1\]"),
    (["--fractions", "ten"], r"'--fractions': 'ten' is not a number"),
    (["--allocation", "water"], r"'--allocation': 'water' is not one of greedy"),
    (["--include", "bottom"], r"'--include': 'bottom' is not one of uniform, random"),
    (["--heads", "no/such/dir"], r"error: --heads .no/such/dir.: no/such/dir does "
                                 r"not exist"),
    (["--query-start", "0"], r"'--query-start': 0 leaves no context"),
])
def test_compress_refuses_bad_input_before_loading(no_model_load, setup, tmp_path, extra,
                                                    message):
    args = _args(setup, tmp_path / "run")
    for opt, value in zip(extra[::2], extra[1::2], strict=True):
        if opt in args:
            args[args.index(opt) + 1] = value
        else:
            args += [opt, value]
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert re.search(message, " ".join(res.output.split())), res.output
    assert not no_model_load and not (tmp_path / "run").exists()


def test_compress_needs_query_start(no_model_load, setup, tmp_path):
    """Trials without meta.query_start are refused, naming the file and the option."""
    bare = [t.__class__(**{**t.to_dict(), "tokens": tuple(t.tokens),
                           "needle_span": tuple(t.needle_span),
                           "meta": {"task": "literal"}}) for t in setup["evals"]["literal"]]
    path = save_trials(bare, tmp_path / "bare.jsonl")
    args = _args(setup, tmp_path / "run")
    args[args.index("--trials") + 1] = str(path)
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert re.search(r"bare\.jsonl:1: the trial has no meta\.query_start.*--query-start N",
                     " ".join(res.output.split())), res.output
    assert not no_model_load and not (tmp_path / "run").exists()


def test_build_trials_organism_writes_what_make_trials_builds(tmp_path):
    """`locos build-trials organism` = `make_trials` (tokens, spans, query_start)."""
    from locos_tl import load_trials

    out = tmp_path / "lit.jsonl"
    res = runner.invoke(app, ["build-trials", "organism", "--out", str(out), "--task",
                              "literal", "--n", "4", "--length", "96", "--seed", "5"])
    assert res.exit_code == 0, res.output
    got = load_trials(out)
    want = make_trials("literal", 4, 96, seed=5)
    assert [t.tokens for t in got] == [t.tokens for t in want]
    assert [t.needle_span for t in got] == [t.needle_span for t in want]
    assert all(t.meta["query_start"] == 94 for t in got)
    bad = runner.invoke(app, ["build-trials", "organism", "--out", str(out), "--task", "x"])
    assert bad.exit_code == 2 and "unknown --task" in bad.output


def test_compress_refuses_an_out_dir_of_another_command(setup):
    """`--out` at a `locos score` run would overwrite its meta.json: refused first."""
    meta = (setup["tmp"] / "scores" / "meta.json").read_text()
    res = runner.invoke(app, _args(setup, setup["tmp"] / "scores"))
    assert res.exit_code != 0 and "another command's run" in res.output
    assert (setup["tmp"] / "scores" / "meta.json").read_text() == meta


def test_heads_takes_a_heads_json_file(setup, tmp_path):
    """`--heads DIR/heads.json` (a file, as `HeadScores.save` writes it) is the same
    ranking as the run it came from."""
    from locos_tl.cli.compress import load_rankings

    by_run = load_rankings([str(setup["tmp"] / "scores")])["locos"]
    saved = by_run.save(tmp_path / "saved")
    by_file = load_rankings([str(saved / "heads.json")])
    assert len(by_file) == 1
    (got,) = by_file.values()
    assert got.top_k(5) == by_run.top_k(5)
    # heads.json keeps every per-trial float64 score (JSON repr is exact); the means are
    # recomputed, a sum of n_trials terms in another order at worst
    tol = sum_tol(by_run.trial_scores.abs().max(), by_run.n_trials, eps=EPS64)
    assert got.scores.numpy() == pytest.approx(by_run.scores.numpy(), abs=tol, rel=0)
    full = load_rankings([f"mine={saved / 'head_scores.json'}"])
    assert full["mine"].top_k(5) == by_run.top_k(5)
    (tmp_path / "heads.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match="is a file but not head scores"):
        load_rankings([str(tmp_path / "heads.txt")])
