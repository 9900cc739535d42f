"""The commands check files and options before loading a model, Ctrl-C says how to
resume (exit code 130), a resumed run says what it skips, figures share one plotly.js."""

from __future__ import annotations

import importlib
import re
import shlex
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from locos_tl import HeadScores, save_trials
from locos_tl.cli import app

runner = CliRunner()


@pytest.fixture
def no_model_load(monkeypatch):
    """Any model load fails the test: the command must refuse before loading."""
    import locos_tl.models

    calls = []

    def load_model(*args, **kwargs):
        calls.append(args)
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(locos_tl.models, "load_model", load_model)
    return calls


@pytest.fixture
def trials_file(tmp_path, own_answer_trials) -> Path:
    return save_trials(own_answer_trials, tmp_path / "trials.jsonl")


@pytest.mark.parametrize("args, message", [
    (["--trials", "missing.jsonl"], r"Invalid value for '--trials'.*missing\.jsonl.*does not "
                                    r"exist"),
    (["--variant", "exactly"], r"Invalid value for '--variant': 'exactly' is not one of raw, "
                               r"exact"),
    (["--method", "locos,l"], r"Invalid value for '--method': 'l' is not one of .*locos.*wu"),
    (["--method", ","], r"Invalid value for '--method': no method given"),
    (["--dtype", "float8"], r"Invalid value for '--dtype': unknown dtype 'float8'"),
    (["--max-new-tokens", "0"], r"Invalid value for '--max-new-tokens'"),
])
def test_score_refuses_bad_input_before_loading(no_model_load, tiny_dirs, trials_file, tmp_path,
                                                args, message):
    base = {"--model": str(tiny_dirs["qwen3"]), "--trials": str(trials_file),
            "--out": str(tmp_path / "run")}
    for opt, value in zip(args[::2], args[1::2], strict=True):
        base[opt] = str(tmp_path / value) if opt == "--trials" else value
    res = runner.invoke(app, ["score", *[w for kv in base.items() for w in kv]])
    assert res.exit_code == 2, res.output
    assert re.search(message, " ".join(res.output.split())), res.output
    assert not no_model_load and not (tmp_path / "run").exists()


@pytest.mark.parametrize("command, args, message", [
    ("ablate", ["--mode", "query"], r"'--mode': 'query' is not one of query_mean"),
    ("ablate", ["--scorer", "rouge"], r"'--scorer': 'rouge' is not one of babilong"),
    ("ablate", ["--means", "nope.safetensors"], r"'--means'.*does not exist"),
    ("ablate", ["--heads", "nodir/"], r"nodir"),
    ("ablate", ["--bottom", "wu"], r"'--bottom': 'wu' is not one of auto, none, locos"),
    ("patch", ["--corruption", "noise"], r"'--corruption': 'noise' is not one of filler"),
    ("patch", ["--answer-position", "end"], r"'--answer-position': 'end' is not one of"),
    ("patch", ["--locos", "nodir"], r"'--locos'.*does not exist"),
    ("calibrate", ["--prompts", "nope.txt"], r"'--prompts'.*does not exist"),
])
def test_causal_commands_refuse_bad_input_before_loading(no_model_load, tiny_dirs, trials_file,
                                                         tmp_path, command, args, message):
    HeadScores("locos", torch.randn(3, 2, 4)).save(tmp_path / "locos")
    opts = {"--model": str(tiny_dirs["qwen3"]), "--out": str(tmp_path / "run")}
    if command == "calibrate":
        (tmp_path / "p.txt").write_text("some text\n")
        opts["--prompts"] = str(tmp_path / "p.txt")
    else:
        opts["--trials"] = str(trials_file)
    if command == "ablate":
        opts["--heads"] = str(tmp_path / "locos")
    for opt, value in zip(args[::2], args[1::2], strict=True):
        opts[opt] = str(tmp_path / value) if opt in ("--means", "--heads", "--locos",
                                                     "--prompts") else value
    res = runner.invoke(app, [command, *[w for kv in opts.items() for w in kv]])
    assert res.exit_code == 2, res.output
    assert re.search(message, " ".join(res.output.split())), res.output
    assert not no_model_load


def _resume_line(output: str) -> list[str]:
    m = re.search(r"run the same command again:\s*\n\s*(locos .+)", output)
    assert m, output
    words = shlex.split(m.group(1))
    assert words[0] == "locos"
    return words[1:]


def test_ctrl_c_during_score_says_how_to_resume(monkeypatch, tiny_dirs, trials_file, tmp_path):
    import locos_tl.score

    real = locos_tl.score.run_trial
    calls = []

    def interrupted_after_two(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    args = ["score", "--model", str(tiny_dirs["qwen3"]), "--trials", str(trials_file),
            "--out", str(tmp_path / "run"), "--max-new-tokens", "8", "--variant", "exact",
            "--method", "locos,wu"]
    monkeypatch.setattr(locos_tl.score, "run_trial", interrupted_after_two)
    res = runner.invoke(app, args)
    assert res.exit_code == 130, res.output
    assert "interrupted" in res.output and "Traceback" not in res.output
    resume = _resume_line(res.output)
    assert len((tmp_path / "run" / "trials.jsonl").read_text().splitlines()) == 2

    monkeypatch.setattr(locos_tl.score, "run_trial", real)
    again = runner.invoke(app, resume)  # the printed command, verbatim
    assert again.exit_code == 0, again.output
    assert f"resuming {tmp_path / 'run'}: skipping 2 of 3 finished trials" in again.output
    full = runner.invoke(app, [*args[:6], str(tmp_path / "full"), *args[7:]])
    assert full.exit_code == 0 and "skipping" not in full.output
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "run" / "scores.csv"),
                                  pd.read_csv(tmp_path / "full" / "scores.csv"))


def test_ctrl_c_during_ablate_says_how_to_resume(monkeypatch, tiny_dirs, trials_file, tmp_path):
    evaluate_module = importlib.import_module("locos_tl.evaluate")  # the module, not
    assert evaluate_module is sys.modules["locos_tl.evaluate"]  # locos_tl.evaluate()
    HeadScores("locos", torch.randn(3, 2, 4)).save(tmp_path / "locos")
    real = evaluate_module.greedy_decode
    calls = []

    def interrupted_after_three(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    args = ["ablate", "--model", str(tiny_dirs["qwen3"]), "--heads", str(tmp_path / "locos"),
            "--trials", str(trials_file), "--out", str(tmp_path / "abl"), "--k", "1",
            "--mode", "query_zero", "--no-random", "--bottom", "none", "--max-new-tokens", "4"]
    monkeypatch.setattr(evaluate_module, "greedy_decode", interrupted_after_three)
    res = runner.invoke(app, args)
    assert res.exit_code == 130, res.output
    resume = _resume_line(res.output)
    assert "--no-random" in resume and resume[resume.index("--mode") + 1] == "query_zero"
    n_done = len((tmp_path / "abl" / "trials.jsonl").read_text().splitlines())
    assert n_done == 3

    monkeypatch.setattr(evaluate_module, "greedy_decode", real)
    again = runner.invoke(app, resume)
    assert again.exit_code == 0, again.output
    assert f"skipping {n_done} finished generations" in again.output
    assert len(pd.read_csv(tmp_path / "abl" / "evaluation.csv")) > 0


def test_figures_share_one_plotly_js(tmp_path):
    """Run-level and per-method figures load one offline plotly.min.js by relative path."""
    from plotly.offline import get_plotlyjs

    from locos_tl.cli.score import write_outputs

    g = torch.Generator().manual_seed(0)
    results = {m: HeadScores(m, torch.rand(3, 2, 4, generator=g)) for m in ("locos", "wu")}
    paths = write_outputs(results, tmp_path / "run")
    single = write_outputs(results["locos"], tmp_path / "single")
    bundles = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("plotly*.js"))
    assert bundles == [Path("run/plotly.min.js"), Path("single/plotly.min.js")]
    assert (tmp_path / "run" / "plotly.min.js").read_text(encoding="utf-8") == get_plotlyjs()
    for d in [*paths.values(), *single.values()]:
        html = (d / "heatmap.html").read_text(encoding="utf-8")
        assert len(html) < 200_000  # the 4.8 MB bundle is not embedded
        srcs = re.findall(r'<script [^>]*src="([^"]+)"', html)
        assert len(srcs) == 1 and "://" not in srcs[0]  # a local file: works offline
        assert (d / srcs[0]).resolve() in {(tmp_path / "run" / "plotly.min.js").resolve(),
                                           (tmp_path / "single" / "plotly.min.js").resolve()}


def test_demo_table_says_no_head_scored(capsys):
    """All-zero Wu scores: no "top heads" in index order, and a line that says so."""
    from locos_tl.cli.demo import ranking_table
    from locos_tl.cli.score import print_top

    part = torch.zeros(3, 2, 4)
    part[:, 1, 2], part[:, 0, 3] = 0.5, 0.25
    res = {"locos": HeadScores("locos", part), "wu": HeadScores("wu", torch.zeros(3, 2, 4))}
    table = ranking_table(res, {(1, 2): "literal copy", (0, 0): "previous-token mover"}, k=4)
    assert list(table["wu head"]) == ["-"] * 4 and table["wu score"].isna().all()
    assert list(table["locos head"]) == ["L1H2", "L0H3", "-", "-"]
    assert list(table["locos score"][:2]) == [0.5, 0.25] and table["locos score"][2:].isna().all()
    assert list(table["locos role"]) == ["literal copy", "-", "-", "-"]
    print_top(res, 10)
    text = capsys.readouterr().out
    assert "wu: no head scored (every score is 0 over 3 accepted trials)" in text
    assert "locos: top 10 heads" in text and "L1H2" in text
