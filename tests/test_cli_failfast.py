"""The commands check files and options before loading a model, Ctrl-C says how to
resume (exit code 130), a resumed run says what it skips, figures share one plotly.js."""

from __future__ import annotations

import importlib
import json
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
    import locos_tl.models.load

    calls = []

    def load_model(*args, **kwargs):
        calls.append(args)
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(locos_tl.models.load, "load_model", load_model)
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
    import locos_tl.experiments.score

    real = locos_tl.experiments.score.run_trial
    calls = []

    def interrupted_after_two(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    args = ["score", "--model", str(tiny_dirs["qwen3"]), "--trials", str(trials_file),
            "--out", str(tmp_path / "run"), "--max-new-tokens", "8", "--variant", "exact",
            "--method", "locos,wu"]
    monkeypatch.setattr(locos_tl.experiments.score, "run_trial", interrupted_after_two)
    res = runner.invoke(app, args)
    assert res.exit_code == 130, res.output
    assert "interrupted" in res.output and "Traceback" not in res.output
    resume = _resume_line(res.output)
    assert len((tmp_path / "run" / "trials.jsonl").read_text().splitlines()) == 2

    monkeypatch.setattr(locos_tl.experiments.score, "run_trial", real)
    again = runner.invoke(app, resume)  # the printed command, verbatim
    assert again.exit_code == 0, again.output
    assert f"resuming {tmp_path / 'run'}: skipping 2 of 3 finished trials" in again.output
    full = runner.invoke(app, [*args[:6], str(tmp_path / "full"), *args[7:]])
    assert full.exit_code == 0 and "skipping" not in full.output
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "run" / "scores.csv"),
                                  pd.read_csv(tmp_path / "full" / "scores.csv"))


def test_ctrl_c_during_ablate_says_how_to_resume(monkeypatch, tiny_dirs, trials_file, tmp_path):
    evaluate_module = importlib.import_module("locos_tl.experiments.evaluate")  # the module, not
    assert evaluate_module is sys.modules["locos_tl.experiments.evaluate"]  # not the function
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


def test_ablate_extend_grows_a_run(tiny_dirs, own_answer_trials, tmp_path):
    """`--extend` keeps a run's generations over a subset of the trials; without it the
    larger trial set is refused, and a set that drops a finished trial is refused even
    with it."""
    HeadScores("locos", torch.randn(3, 2, 4, generator=torch.Generator().manual_seed(0))
               ).save(tmp_path / "locos")
    small = save_trials(own_answer_trials[:2], tmp_path / "small.jsonl")
    full = save_trials(own_answer_trials, tmp_path / "full.jsonl")
    other = save_trials(own_answer_trials[1:], tmp_path / "other.jsonl")
    run, ref = tmp_path / "abl", tmp_path / "ref"
    args = ["ablate", "--model", str(tiny_dirs["qwen3"]), "--heads", str(tmp_path / "locos"),
            "--k", "1", "--mode", "query_zero", "--no-random", "--bottom", "none",
            "--max-new-tokens", "4"]
    first = runner.invoke(app, [*args, "--trials", str(small), "--out", str(run),
                                "--control", str(small)])
    assert first.exit_code == 0, first.output
    records = run / "trials.jsonl"
    n_small = len(records.read_text().splitlines())
    assert n_small == 2 * 2  # baseline + locos-1, two trials
    assert len((run / "control" / "trials.jsonl").read_text().splitlines()) == n_small
    refused = runner.invoke(app, [*args, "--trials", str(full), "--out", str(run)])
    assert refused.exit_code == 2 and "another trial set" in " ".join(refused.output.split())
    dropped = runner.invoke(app, [*args, "--trials", str(other), "--out", str(run), "--extend"])
    assert dropped.exit_code == 2 and "cannot be extended" in " ".join(dropped.output.split())
    assert len(records.read_text().splitlines()) == n_small  # nothing written
    grown = runner.invoke(app, [*args, "--trials", str(full), "--out", str(run), "--extend",
                                "--control", str(full)])  # the control run grows too
    assert grown.exit_code == 0, grown.output
    assert f"skipping {n_small} finished generations" in grown.output
    n_new = 2 * (len(own_answer_trials) - 2)
    assert len(records.read_text().splitlines()) == n_small + n_new
    assert len((run / "control" / "trials.jsonl").read_text().splitlines()) == n_small + n_new
    fresh = runner.invoke(app, [*args, "--trials", str(full), "--out", str(ref),
                                "--control", str(full)])
    assert fresh.exit_code == 0, fresh.output
    for name in ("evaluation.csv", "control/evaluation.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(run / name), pd.read_csv(ref / name))


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
    from locos_tl.cli.demo_tables import ranking_table
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


# -- every command checks the trials file, the run directory, --means and --out
# before the model loads; clear errors instead of tracebacks; no accepted trial fails ----
def _command_args(command: str, tiny_dirs, tmp_path: Path, trials: Path) -> list[str]:
    """A full command line for ``command`` on the tiny Qwen3 (its head scores under
    ``tmp_path/locos``), reading ``trials``, writing ``tmp_path/run``."""
    from locos_tl.cli.ablate import checkpoint_dims

    n_layers, n_heads = checkpoint_dims(str(tiny_dirs["qwen3"]))
    HeadScores("locos", torch.randn(3, n_layers, n_heads)).save(tmp_path / "locos")
    args = [command, "--model", str(tiny_dirs["qwen3"]), "--trials", str(trials),
            "--out", str(tmp_path / "run")]
    if command in ("ablate", "compress"):
        args += ["--heads", str(tmp_path / "locos")]
    if command == "compress":
        args += ["--query-start", "-2"]
    return args


BAD_TRIALS = {  # file text -> what the error must say (the file's name is added)
    "broken": ('{"tokens": [1, 2, 3], "needle_span": [0, 1], "answer": "a"}\n{"tokens": [1,\n',
               r":2: not valid JSON"),
    "missing": ('{"prompt": "the cat sat on the mat", "needle": "cat"}\n',
                r":1: record lacks field\(s\) \['answer'\]"),
    "empty": ("\n\n", r" holds no trial"),
    "needle": ('{"prompt": "the cat sat on the mat", "needle": "dog", "answer": "mat"}\n',
               r":1: needle 'dog' not found in the prompt"),
}


@pytest.mark.parametrize("command", ["score", "ablate", "patch", "compress"])
@pytest.mark.parametrize("case", sorted(BAD_TRIALS))
def test_trials_file_contents_checked_before_loading(no_model_load, tiny_dirs, tmp_path,
                                                     command, case):
    text, message = BAD_TRIALS[case]
    trials = tmp_path / "t.jsonl"
    trials.write_text(text)
    res = runner.invoke(app, _command_args(command, tiny_dirs, tmp_path, trials))
    assert res.exit_code == 2, res.output
    flat = " ".join(res.output.split())
    assert re.search(re.escape(str(trials)) + message, flat), res.output
    assert "Traceback" not in res.output
    assert not no_model_load and not (tmp_path / "run").exists()


def test_trials_file_checked_without_a_tokenizer_before_loading(no_model_load, tmp_path):
    """A model whose tokenizer cannot be had without loading it (a hub name, offline):
    the file's JSON, fields and needles are still checked first."""
    trials = tmp_path / "t.jsonl"
    for text, message in BAD_TRIALS.values():
        trials.write_text(text)
        res = runner.invoke(app, ["score", "--model", "nosuch-org/nosuch-model", "--trials",
                                  str(trials), "--out", str(tmp_path / "run")])
        assert res.exit_code == 2, res.output
        assert re.search(re.escape(str(trials)) + message, " ".join(res.output.split()))
        assert not no_model_load


def test_score_run_directory_conflicts_before_loading(monkeypatch, tiny_dirs, own_answer_trials,
                                                      tmp_path):
    a = save_trials(own_answer_trials[:1], tmp_path / "a.jsonl")
    b = save_trials(own_answer_trials[1:3], tmp_path / "b.jsonl")
    args = ["score", "--model", str(tiny_dirs["qwen3"]), "--out", str(tmp_path / "run"),
            "--max-new-tokens", "8", "--trials"]
    assert runner.invoke(app, [*args, str(a)]).exit_code == 0
    import locos_tl.models.load

    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the run directory was checked")

    monkeypatch.setattr(locos_tl.models.load, "load_model", load_model)
    for extra, message in [([str(b)], r"holds a run over another trial set"),
                           ([str(a), "--variant", "exact"],
                            r"holds a run with other settings \(variant: 'raw' != 'exact'\)"),
                           ([str(a), "--max-new-tokens", "9"],
                            r"other settings \(max_new_tokens: 8 != 9\)")]:
        res = runner.invoke(app, [*args, *extra])
        assert res.exit_code == 2, res.output
        assert re.search(message, " ".join(res.output.split())), res.output
        assert "resuming" not in res.output and "Traceback" not in res.output


def _fake_run(out: Path, settings: dict) -> None:
    """A run directory as the commands write it (meta.json + one record), over another
    trial set."""
    out.mkdir(parents=True)
    (out / "meta.json").write_text(json.dumps({"settings": {
        **settings, "n_trials": 5, "trial_set_hash": "0123456789abcdef"}}))
    (out / "trials.jsonl").write_text('{"trial_id": "x"}\n')


@pytest.mark.parametrize("command", ["ablate", "patch"])
def test_causal_run_directory_conflicts_before_loading(no_model_load, tiny_dirs, trials_file,
                                                       tmp_path, command):
    _fake_run(tmp_path / "run", {})
    res = runner.invoke(app, _command_args(command, tiny_dirs, tmp_path, trials_file))
    assert res.exit_code == 2, res.output
    assert re.search(r"holds a run over another trial set \(trial-set hash 0123456789abcdef",
                     " ".join(res.output.split())), res.output
    assert "resuming" not in res.output and not no_model_load


def test_compress_trial_set_conflict_before_loading(monkeypatch, tiny_dirs, own_answer_trials,
                                                    tmp_path):
    a = save_trials(own_answer_trials[:1], tmp_path / "a.jsonl")
    b = save_trials(own_answer_trials[1:], tmp_path / "b.jsonl")
    args = [*_command_args("compress", tiny_dirs, tmp_path, a), "--fractions", "1",
            "--include", "none", "--max-new-tokens", "2"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    import locos_tl.models.load

    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the run directory was checked")

    monkeypatch.setattr(locos_tl.models.load, "load_model", load_model)
    args[args.index("--trials") + 1] = str(b)
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert re.search(r"holds a compression run with other settings \(n_trials, "
                     r"trial_set_hash\)", " ".join(res.output.split())), res.output
    assert "resuming" not in res.output


def test_demo_run_directory_conflict_before_loading(no_model_load, tmp_path):
    from locos_tl.organisms import SMALL_ORGANISM

    _fake_run(tmp_path / "d" / "nonliteral_synthetic", {})
    res = runner.invoke(app, ["demo", "--model", SMALL_ORGANISM, "--length", "64",
                              "--n-trials", "2", "--out", str(tmp_path / "d"),
                              "--book", str(tmp_path / "nobook.txt")])
    assert res.exit_code == 2, res.output
    assert "holds a run over another trial set" in " ".join(res.output.split())
    assert not no_model_load


def test_means_file_checked_before_loading(no_model_load, tiny_dirs, trials_file, tmp_path):
    from locos_tl.cli._common import checkpoint_d_head
    from locos_tl.cli.ablate import checkpoint_dims
    from locos_tl.engine.ablation import AblationMeans

    args = [*_command_args("ablate", tiny_dirs, tmp_path, trials_file), "--k", "1"]
    (tmp_path / "x.json").write_text('{"q": [1, 2]}')
    res = runner.invoke(app, [*args, "--means", str(tmp_path / "x.json")])
    assert res.exit_code == 2, res.output
    flat = " ".join(res.output.split())
    assert f"--means {tmp_path / 'x.json'} is not a calibration means file" in flat
    assert "SafetensorError" not in res.output and "Traceback" not in res.output
    L, H = checkpoint_dims(str(tiny_dirs["qwen3"]))
    d = checkpoint_d_head(str(tiny_dirs["qwen3"]))
    for shape in [(L + 1, H, d), (L, H, d + 1)]:
        AblationMeans(q=torch.zeros(shape), z=torch.zeros(shape)).save(tmp_path / "m.st")
        res = runner.invoke(app, [*args, "--means", str(tmp_path / "m.st")])
        assert res.exit_code == 2, res.output
        assert f"q has shape {shape} (layers, heads, head width), the model " \
               f"{tiny_dirs['qwen3']} {(L, H, d)}" in " ".join(res.output.split())
    assert not no_model_load and not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["score", "ablate", "patch", "compress", "demo",
                                     "calibrate"])
def test_out_is_checked_before_loading(no_model_load, tiny_dirs, trials_file, tmp_path,
                                       command):
    taken = tmp_path / "taken"
    taken.write_text("a file")
    if command == "demo":
        args = ["demo", "--out", str(taken)]
    elif command == "calibrate":
        (tmp_path / "p.txt").write_text("some text\n")
        taken = tmp_path
        args = ["calibrate", "--model", str(tiny_dirs["qwen3"]), "--prompts",
                str(tmp_path / "p.txt"), "--out", str(taken)]
    else:
        args = _command_args(command, tiny_dirs, tmp_path, trials_file)
        args[args.index("--out") + 1] = str(taken / "sub" if command == "patch" else taken)
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    flat = " ".join(res.output.split())
    assert "Invalid value for '--out'" in flat, res.output
    assert ("is a directory" if command == "calibrate" else "file") in flat
    assert "FileExistsError" not in res.output and not no_model_load
    assert taken.is_dir() if command == "calibrate" else taken.read_text() == "a file"


def test_no_accepted_trial_fails_with_one_message(tiny_dirs, own_answer_trials, tmp_path):
    from locos_tl import Trial

    unanswered = [Trial(tokens=t.tokens, needle_span=t.needle_span, answer="Zyxwvut")
                  for t in own_answer_trials]
    trials = save_trials(unanswered, tmp_path / "t.jsonl")
    res = runner.invoke(app, ["score", "--model", str(tiny_dirs["qwen3"]), "--trials",
                              str(trials), "--out", str(tmp_path / "run"), "--method",
                              "locos,wu", "--max-new-tokens", "4"])
    assert res.exit_code == 2, res.output
    flat = " ".join(res.output.split())
    assert flat.count("no trial was accepted") == 1, res.output
    assert "0 of 3 (3 failed the ROUGE-1 gate" in flat
    assert f"{tmp_path / 'run'}/trials.jsonl" in flat
    assert "warning" not in res.output.lower() and "top 10 heads" not in res.output
    assert not (tmp_path / "run" / "locos").exists()  # no all-NaN outputs
    assert len((tmp_path / "run" / "trials.jsonl").read_text().splitlines()) == 3


def test_lengths_checked_against_the_context_before_any_work(no_model_load, tmp_path):
    from locos_tl.organisms import LONG_ORGANISM, SMALL_ORGANISM

    out = tmp_path / "t.jsonl"
    n_ctx = json.loads((Path(LONG_ORGANISM) / "config.json").read_text())[
        "max_position_embeddings"]
    res = runner.invoke(app, ["build-trials", "organism", "--length", "8192", "--out",
                              str(out)])
    assert res.exit_code == 2, res.output
    assert (f"--length 8192 does not fit retrieval-long: its context is {n_ctx} tokens "
            f"(max_position_embeddings), which holds prompts of at most {n_ctx - 7} tokens"
            ) in " ".join(res.output.split())
    assert not out.exists()
    ok = runner.invoke(app, ["build-trials", "organism", "--length", str(n_ctx - 7), "--n",
                             "1", "--out", str(out)])
    assert ok.exit_code == 0, ok.output
    small_ctx = json.loads((Path(SMALL_ORGANISM) / "config.json").read_text())[
        "max_position_embeddings"]
    res = runner.invoke(app, ["demo", "--model", "retrieval-2l", "--length", "4096",
                              "--out", str(tmp_path / "d")])
    assert res.exit_code == 2, res.output
    assert (f"--length 4096 does not fit retrieval-2l: its context is {small_ctx} tokens"
            in " ".join(res.output.split()))
    assert not no_model_load and not (tmp_path / "d").exists()


def test_calibrate_prompts_checked_before_loading(no_model_load, tiny_dirs, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"text": "some text"}\n{"text": \n')
    res = runner.invoke(app, ["calibrate", "--model", str(tiny_dirs["qwen3"]), "--prompts",
                              str(prompts), "--out", str(tmp_path / "m.safetensors")])
    assert res.exit_code == 2, res.output
    assert f"{prompts}:2: not valid JSON" in " ".join(res.output.split())
    assert not no_model_load and not (tmp_path / "m.safetensors").exists()


def test_the_old_stop_at_newline_flag_is_gone(tiny_dirs, trials_file, tmp_path):
    """``--no-stop-at-newline`` was ``--stop-rule none``; removed before the first
    release, it is refused as an unknown option."""
    HeadScores("locos", torch.randn(3, 2, 4)).save(tmp_path / "locos")
    opts = ["ablate", "--model", str(tiny_dirs["qwen3"]), "--trials", str(trials_file),
            "--heads", str(tmp_path / "locos"), "--mode", "query_zero",
            "--out", str(tmp_path / "r")]
    for flag in ("--no-stop-at-newline", "--stop-at-newline"):
        res = runner.invoke(app, [*opts, flag])
        assert res.exit_code == 2, res.output
        assert f"No such option: {flag}" in res.output
    assert not (tmp_path / "r").exists()
