"""Fixes from a new-user trial of the CLI and the Python API, on the shipped organism
``data/organisms/retrieval-2l`` (2 layers x 8 heads): a run directory over other trials
is refused before anything in it changes; an all-zero ranking is no result; the echo
control's budget; head and ``--k`` checks before the model loads; option ranges."""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from locos_tl import HeadScores, save_trials
from locos_tl.cli import app
from locos_tl.organisms import SMALL_ORGANISM, make_echo_trials, make_trials

runner = CliRunner()
ABLATE = ["--heads", "w=L1H0", "--k", "1", "--no-random", "--bottom", "none",
          "--max-new-tokens", "2"]


@pytest.fixture
def no_model_load(monkeypatch):
    """Any model load fails the test: the command must refuse before loading."""
    import locos_tl.models.load

    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(locos_tl.models.load, "load_model", load_model)


def _ablate(trials: Path, out: Path, *extra: str):
    return runner.invoke(app, ["ablate", "--model", SMALL_ORGANISM, "--trials", str(trials),
                               "--out", str(out), *ABLATE, *extra])


# -- 1. resuming ------------------------------------------------------------------------------
def test_ablate_refuses_other_trials_before_touching_the_run_and_reuses_its_means(
        tmp_path, monkeypatch):
    a = save_trials(make_trials("nonliteral", 3, 64, seed=1), tmp_path / "a.jsonl")
    b = save_trials(make_trials("nonliteral", 3, 64, seed=2), tmp_path / "b.jsonl")
    out = tmp_path / "a1"
    res = _ablate(a, out)
    assert res.exit_code == 0, res.output
    means = out / "means.safetensors"
    # same permissions as the run's other files (umask), not safetensors' 0600
    assert means.stat().st_mode & 0o777 == (out / "meta.json").stat().st_mode & 0o777
    assert means.stat().st_mode & 0o777 == 0o666 & ~_umask()
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    first = pd.read_csv(out / "evaluation.csv")

    res = _ablate(b, out)  # another trial set: refused, nothing rewritten, no "resuming"
    assert res.exit_code == 2, res.output
    assert "another trial set" in res.output and "resuming" not in res.output
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == before

    import locos_tl.engine.ablation

    def no_calibration(*args, **kwargs):
        raise AssertionError("a resumed run recalibrated instead of reusing its means")

    monkeypatch.setattr(locos_tl.engine.ablation, "calibrate_means", no_calibration)
    res = _ablate(a, out)  # a legitimate resume reuses means.safetensors
    assert res.exit_code == 0, res.output
    assert "reusing" in res.output and "skipping 6 finished generations" in res.output
    assert means.read_bytes() == before["means.safetensors"][0]
    pd.testing.assert_frame_equal(pd.read_csv(out / "evaluation.csv"), first)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- 2. all-zero rankings ---------------------------------------------------------------------
def test_rankings_of_all_zero_scores_warn():
    zero = HeadScores("wu", torch.zeros(3, 2, 4))
    for call, expected in [(lambda: zero.top_k(3), [(0, 0), (0, 1), (0, 2)]),
                           (lambda: zero.bottom_k(2), [(0, 0), (0, 1)]),
                           (lambda: zero.ranked()[:2], [(0, 0), (0, 1)])]:
        with pytest.warns(RuntimeWarning, match="every score is 0: the ranking is index order"):
            assert call() == expected
    per_trial = torch.zeros(3, 2, 4)
    per_trial[:, 1, 2] = 1.0  # one real score: a ranking, no warning
    hs = HeadScores("wu", per_trial)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hs.top_k(1) == [(1, 2)]
        assert not hs.all_zero


def test_ablate_refuses_an_all_zero_head_set_before_loading(tmp_path, no_model_load):
    HeadScores("wu", torch.zeros(3, 2, 8)).save(tmp_path / "wu")
    a = save_trials(make_trials("nonliteral", 2, 64, seed=1), tmp_path / "a.jsonl")
    res = runner.invoke(app, ["ablate", "--model", SMALL_ORGANISM, "--trials", str(a),
                              "--out", str(tmp_path / "run"), "--heads", str(tmp_path / "wu"),
                              "--k", "1"])
    assert res.exit_code == 2, res.output
    assert "every wu score is 0" in res.output and "--heads wu=L0H0" in res.output
    assert not (tmp_path / "run").exists()


# -- 3. echo control --------------------------------------------------------------------------
def test_echo_control_budget_is_one_token_and_p0_zero_warns(tmp_path):
    a = save_trials(make_trials("nonliteral", 2, 64, seed=1), tmp_path / "a.jsonl")
    echo = make_echo_trials(3, seed=0, top=50)
    # rotate the answers: the organism echoes its word, so no answer matches and P0 = 0
    wrong = [dataclasses.replace(t, answer=echo[(i + 1) % 3].answer)
             for i, t in enumerate(echo)]
    assert all(t.meta.get("control") == "echo" for t in wrong)
    c = save_trials(wrong, tmp_path / "echo.jsonl")
    out = tmp_path / "run"
    res = runner.invoke(app, ["ablate", "--model", SMALL_ORGANISM, "--trials", str(a),
                              "--out", str(out), "--control", str(c), "--heads", "w=L1H0",
                              "--k", "1", "--no-random", "--bottom", "none", "--mode",
                              "output_zero", "--max-new-tokens", "4"])
    assert res.exit_code == 0, res.output
    control_meta = json.loads((out / "control" / "meta.json").read_text())
    assert control_meta["settings"]["max_new_tokens"] == 1
    assert json.loads((out / "meta.json").read_text())["settings"]["max_new_tokens"] == 4
    ds = pd.read_csv(out / "dissociation.csv")
    assert (ds["P0"] == 0).all() and ds["ds"].isna().all()
    assert "P0 = 0.0" in res.output and "undefined" in res.output


# -- 4. head and k checks before the model loads ----------------------------------------------
@pytest.mark.parametrize("extra, message", [
    (["--heads", "w=L2H0", "--k", "1"], r"head \(2, 0\) is outside the model's 2 layers x 8 heads"),
    (["--heads", "w=L1H8", "--k", "1"], r"head \(1, 8\) is outside the model's 2 layers x 8 heads"),
    (["--heads", "w=L1H0", "--k", "17"], r"--k = 17 is more heads than the model has.*1\.\.16"),
])
def test_ablate_checks_heads_and_k_against_the_checkpoint_before_loading(
        tmp_path, no_model_load, extra, message):
    import re

    a = save_trials(make_trials("nonliteral", 2, 64, seed=1), tmp_path / "a.jsonl")
    out = tmp_path / "run"
    res = runner.invoke(app, ["ablate", "--model", SMALL_ORGANISM, "--trials", str(a),
                              "--out", str(out), *extra])
    assert res.exit_code == 2, res.output
    assert re.search(message, res.output), res.output
    assert not out.exists()


def test_checkpoint_dims_read_the_config():
    from locos_tl.cli.ablate import checkpoint_dims

    cfg = json.loads((Path(SMALL_ORGANISM) / "config.json").read_text())
    assert checkpoint_dims(SMALL_ORGANISM) == (cfg["num_hidden_layers"],
                                                 cfg["num_attention_heads"]) == (2, 8)
    assert checkpoint_dims("Qwen/Qwen3-8B") is None  # a hub name: checked after the load


# -- 5. demo range ----------------------------------------------------------------------------
def test_demo_refuses_zero_trials(tmp_path):
    res = runner.invoke(app, ["demo", "--n-trials", "0", "--out", str(tmp_path / "d")])
    assert res.exit_code == 2, res.output
    assert "Invalid value for '--n-trials'" in res.output
    assert not (tmp_path / "d").exists()


# -- 6. score_trials returns one type: several methods are score_methods' ----------------------
def test_score_trials_refuses_methods_and_names_score_methods():
    from locos_tl import score_methods, score_trials

    trials = make_trials("nonliteral", 1, 64, seed=1)
    with pytest.raises(TypeError, match=r"both method= and methods=.*score_methods\(model"):
        score_trials(None, trials, method="locos", methods=["wu"])
    with pytest.raises(TypeError, match=r"score_trials\(\) got unknown keyword\(s\) \['mthod'\]"):
        score_trials(None, trials, mthod="wu")
    with pytest.raises(TypeError, match=r"score_methods\(\) got unknown keyword\(s\)"):
        score_methods(None, trials, method="locos")


def test_score_trials_with_methods_still_returns_the_dict_with_a_warning(qwen3,
                                                                        own_answer_trials):
    """The old spelling keeps working for existing users (deprecated), with the same
    numbers as score_methods."""
    from locos_tl import score_methods, score_trials

    kw = dict(methods=["locos", "wu"], max_new_tokens=8, progress=False)
    with pytest.warns(DeprecationWarning, match=r"score_trials\(methods=\[\.\.\.\]\) is "
                                                r"deprecated.*score_methods"):
        old = score_trials(qwen3, own_answer_trials[:2], **kw)
    new = score_methods(qwen3, own_answer_trials[:2], **kw)
    assert list(old) == list(new) == ["locos", "wu"]
    for m in new:
        torch.testing.assert_close(old[m].scores, new[m].scores, rtol=0, atol=0,
                                   equal_nan=True)  # same decode, same arithmetic


# -- 7. a method folder that is no method -----------------------------------------------------
def test_heads_with_an_unknown_method_lists_the_methods(tmp_path):
    from locos_tl.detectors import DETECTORS
    from locos_tl.errors import LocosError
    from locos_tl.runs.rundir import _choose

    with pytest.raises(LocosError) as exc:
        _choose(tmp_path / "s1", ["locos", "wu"], "nosuch")
    msg = str(exc.value)
    assert "'nosuch' is no method" in msg and "--method nosuch" not in msg
    assert all(m in msg for m in DETECTORS)


# -- 8. the test script, rankings of more heads than there are, one default ---------------
def test_test_script_runs_every_step_and_lists_the_failures(tmp_path):
    """scripts/test.sh runs ruff, pytest, the notebooks, the docs build and the wheel
    check even when steps fail, names each failed step at the end and exits non-zero."""
    import shutil
    import stat
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    (tmp_path / "scripts").mkdir()
    shutil.copy(repo / "scripts" / "test.sh", tmp_path / "scripts" / "test.sh")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    log = tmp_path / "calls.log"
    fakes = {  # ruff fails; pytest fails for the notebooks only; mkdocs passes
        "ruff": "exit 3",
        "python": 'case "$*" in *notebooks*) exit 1;; *) exit 0;; esac',
        "mkdocs": "exit 0",
    }
    for name, body in fakes.items():
        f = bin_dir / name
        f.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >> "{log}"\n{body}\n')
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "scripts" / "wheel_check.sh").write_text(f'echo "wheel" >> "{log}"\nexit 0\n')
    res = subprocess.run(["bash", str(tmp_path / "scripts" / "test.sh"), "-x"],
                         capture_output=True, text=True, timeout=60)
    calls = log.read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["ruff", "python", "python", "mkdocs", "wheel"]
    assert calls[1] == "python -m pytest -x"  # extra arguments go to the first pytest
    assert res.returncode == 1, res.stdout
    assert "2 of 5 steps failed:\n    ruff (exit code 3)\n    notebooks (exit code 1)" \
        in res.stdout
    fakes["ruff"] = fakes["python"] = "exit 0"
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
    res = subprocess.run(["bash", str(tmp_path / "scripts" / "test.sh")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "all 5 steps passed" in res.stdout, res.stdout


def test_top_k_of_more_heads_than_there_are_raises():
    from locos_tl.errors import HeadSpecError

    hs = HeadScores("locos", torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0)))
    assert len(hs.top_k(24)) == 24 and len(hs.bottom_k(24)) == 24
    assert sorted(hs.top_k(24)) == [(l, h) for l in range(3) for h in range(8)]
    for rank in (hs.top_k, hs.bottom_k):
        with pytest.raises(ValueError, match=r"k = 100 is more heads than there are: 24 in "
                                             r"all \(3 layers x 8 heads\)") as info:
            rank(100)
        assert isinstance(info.value, HeadSpecError)


def test_one_default_organism_everywhere():
    """DEFAULT_ORGANISM, the demo's default and the docs name one organism; every
    shipped checkpoint is listed; the docs' head labels are the default's heads."""
    import re

    from locos_tl.cli.demo import resolve_organism
    from locos_tl.organisms import DEFAULT_ORGANISM, LONG_ORGANISM, ORGANISMS

    repo = Path(__file__).resolve().parents[1]
    assert Path(DEFAULT_ORGANISM) == Path(LONG_ORGANISM) == resolve_organism(None)
    assert Path(DEFAULT_ORGANISM).name == "retrieval-long"
    shipped = sorted(p.name for p in (repo / "data" / "organisms").iterdir()
                     if (p / "config.json").exists())
    assert shipped == sorted(ORGANISMS)
    assert all(Path(ORGANISMS[n]).name == n for n in shipped)
    readme = (repo / "docs" / "organisms.md").read_text()
    assert f"{['', 'One', 'Two', 'Three', 'Four'][len(shipped)]} checkpoints ship" in readme
    assert all(f"`{n}`" in readme for n in shipped)
    assert "`retrieval-long`, the default" in readme
    # the figures show the default organism: every head the docs name is one of its roles
    gt = json.loads((Path(DEFAULT_ORGANISM) / "ground_truth.json").read_text())
    roles = {f"L{l}H{h}" for key in ("literal_copy", "nonliteral_writer", "prev_token")
             for l, h in gt[key]}
    intro = (repo / "docs" / "figures.md").read_text().split("\n## ")[0]
    named = set(re.findall(r"L\dH\d", intro))
    assert named and named <= roles, named - roles
    assert {f"L{l}H{h}" for l, h in gt["nonliteral_writer"]} <= named


def test_niah_help_names_the_spans():
    res = runner.invoke(app, ["build-trials", "niah", "--help"])
    text = " ".join(res.output.split())
    assert res.exit_code == 0 and "span = real_needle" not in text
    assert "needle span = the whole needle" in text and "answer span = its real_needle" in text
