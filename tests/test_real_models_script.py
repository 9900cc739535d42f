"""benchmarks/real_models.py: when the trial files are rebuilt (growing a run)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "real_models.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("real_models_script", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_trials_rebuilt_only_when_an_option_they_depend_on_changes(script, tmp_path) -> None:
    args = script.parse_args(["--model", "smollm2-135m-instruct", "--out", str(tmp_path)])
    assert script._trials_changed(tmp_path, args)  # nothing built yet
    script._mark(tmp_path, "trials", {"seconds": 1.0})  # a run from before sizes were kept
    assert script._trials_changed(tmp_path, args)
    script._mark(tmp_path, "trials", {"seconds": 1.0, "sizes": script._trial_sizes(args)})
    assert not script._trials_changed(tmp_path, args)
    grown = str(script.PRESETS["cpu"]["n_eval"] + 20)  # a larger evaluation sample
    for flag, value in [("--n-eval", grown), ("--model", "gemma-3-270m"),
                        ("--n-calibration", "20"), ("--template", "completion")]:
        other = script.parse_args(["--model", "smollm2-135m-instruct", "--out",
                                   str(tmp_path), flag, value])
        assert script._trials_changed(tmp_path, other), flag
    # options the trial files do not depend on leave them alone
    same = script.parse_args(["--model", "smollm2-135m-instruct", "--out", str(tmp_path),
                              "--ks", "1,5", "--workers", "2", "--n-cri", "20"])
    assert not script._trials_changed(tmp_path, same)
    stored = json.loads((tmp_path / "stages" / "trials.done").read_text())["sizes"]
    assert stored["n_eval"] == script.PRESETS["cpu"]["n_eval"]


@pytest.mark.parametrize("workers", [1, 2])
def test_ablation_workers_run_at_nice_0(script, tmp_path, monkeypatch, workers) -> None:
    """Ray starts workers at nice 15; the sweep's own workers are asked for nice 0."""
    import locos_tl as lt

    calls = []
    monkeypatch.setattr(lt, "evaluate", lambda model, trials, sets, **kw: calls.append(kw))
    monkeypatch.setattr(script, "_load", lambda path: [])
    args = script.parse_args(["--model", "smollm2-135m-instruct", "--out", str(tmp_path),
                              "--workers", str(workers), "--questions", "direct"])
    script.ablate(None, args, tmp_path, {}, means=None)
    assert len(calls) == 3  # direct at one length, then the two controls
    for kw in calls:
        if workers > 1:
            env = kw["ray_init_kwargs"]["runtime_env"]["env_vars"]
            assert env == {"RAY_worker_niceness": "0"}
        else:
            assert "ray_init_kwargs" not in kw
