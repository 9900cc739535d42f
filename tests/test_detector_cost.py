"""benchmarks/detector_cost.py: the scaling fits behind its estimates, the choice of
cells it estimates instead of running, and its memory checks."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def dc():
    sys.path.insert(0, str(BENCH))  # the script imports its cell module beside it
    try:
        spec = importlib.util.spec_from_file_location("detector_cost", BENCH / "detector_cost.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH))
    return mod


def quad(n):  # seconds: 2 + 3e-3 n + 1e-7 n^2
    return 2 + 3e-3 * n + 1e-7 * n * n


def lin(n):  # MB: 100 + 0.5 n
    return 100 + 0.5 * n


def rows(ns, det="atp"):
    return [{"detector": det, "tokens": n, "seconds": quad(n), "peak_growth_mb": lin(n),
             "forwards": 3, "backwards": 1, "estimated": False} for n in ns]


def test_fit_recovers_a_quadratic_from_three_points_and_a_line_from_two(dc):
    coef = dc.fit([1000, 4000, 8000], [quad(n) for n in (1000, 4000, 8000)], 2)
    # three points determine the three coefficients; float64 least squares on columns
    # scaled to O(1) leaves a relative error near 1e-12
    assert coef == pytest.approx([2, 3e-3, 1e-7], rel=1e-8)
    assert dc.predict(coef, 16000) == pytest.approx(2 + 48 + 25.6, rel=1e-8)
    assert dc.fit([1000, 3000], [lin(1000), lin(3000)], 1) == pytest.approx([100, 0.5])
    assert dc.fit([2000], [10.0], 2) == [0.0, 10.0 / 2000]  # one point: proportional


def test_fit_never_predicts_a_shrinking_cost(dc):
    # noisy timings that a free quadratic would bend downwards: the coefficients stay >= 0
    coef = dc.fit([1000, 2000, 4000], [10.0, 9.0, 12.0], 2)
    assert min(coef) >= 0
    assert dc.predict(coef, 32000) >= dc.predict(coef, 4000)


def test_plan_runs_a_cell_within_the_limits_and_estimates_one_beyond(dc):
    measured = rows([1000, 4000, 8000])
    t16, m16 = quad(16000), lin(16000)  # 75.6 s, 8100 MB
    assert dc.plan(measured, 16000, max_s=t16 + 1, max_mb=m16 + 1) is None
    assert dc.plan([], 1000, max_s=0, max_mb=0) is None  # nothing to predict from: run
    est = dc.plan(measured, 16000, max_s=60, max_mb=1e9)
    assert est["seconds"] == pytest.approx(t16, rel=1e-8)
    assert est["peak_growth_mb"] == pytest.approx(m16, rel=1e-8)
    assert (est["forwards"], est["backwards"]) == (3, 1)
    assert est["note"].startswith("estimate (time > 1 min)")
    assert "fit to 1000,4000,8000" in est["note"]
    est = dc.plan(measured, 16000, max_s=1e9, max_mb=m16 - 1)
    assert est["note"].startswith("estimate (memory > 7.9 GB)")
    # only shorter measured lengths count
    assert dc.plan(measured, 4000, max_s=quad(4000) - 1, max_mb=1e9)["note"].endswith(
        "fit to 1000")


def test_checks_give_the_per_token_growth_ratio_and_the_ratios_to_generation(dc):
    ns = (4000, 8000, 16000)
    mem = {"hf_generate": lambda n: 200 + 0.1 * n, "locos": lambda n: 100 + 0.05 * n,
           "atp": lambda n: 1e-5 * n * n}
    rs = [{"detector": d, "tokens": n, "peak_growth_mb": f(n), "estimated": False}
          for d, f in mem.items() for n in ns]
    rs.append({"detector": "cri", "tokens": 16000, "peak_growth_mb": 1.0, "estimated": True})
    lines = dc.checks(rs)
    assert lines[0].startswith("memory growth per token 8000->16000 over 4000->8000")
    by = {ln.split()[0]: ln for ln in lines[1:]}
    assert set(by) == {"hf_generate", "locos", "atp"}  # cri: estimated at 16000 only
    # atp: (2560 - 640) / 8000 over (640 - 160) / 4000 = 2.00; 2560 / 1800, 2560 / 900
    assert "ratio 2.00; / hf_generate 1.42; / locos 2.84" in by["atp"]
    assert "ratio 1.00; / hf_generate 0.50; / locos 1.00" in by["locos"]
    assert dc.checks(rs[:2]) == ["memory checks need three measured lengths up to 16000"]


def test_decode_steps_count_the_first_decode_loop_only(dc, qwen3):
    import locos_tl as lt

    cell = sys.modules["detector_cost_cell"]
    embed = qwen3.original_model.get_input_embeddings().weight
    with cell.DecodeSteps(embed) as steps:
        res = lt.greedy_decode(qwen3, list(range(5, 40)), max_new_tokens=6,
                               stop_rule="none", stop_at_eos=False)
    assert len(res.generated) == 6
    assert steps.steps == 6  # the bridge's decode runs a step for every generated token
    # a greedy search of 3 steps, then passes over the prompt in query chunks, one of
    # them a single token: only the search counts
    steps.calls = [1023, 1, 1, 1, 1024, 1024, 1, 300]
    assert steps.steps == 3
    steps.calls = [1024, 1024, 255]
    assert steps.steps == 0


@pytest.mark.slow
def test_tiny_run_measures_estimates_and_resumes(dc, tmp_path, monkeypatch):
    import pandas as pd

    monkeypatch.syspath_prepend(str(BENCH))
    argv = ["--shape", "tiny", "--lengths", "256,320,384", "--detectors",
            "locos,atp_prompt_end", "--out", str(tmp_path), "--max-minutes", "1e-6"]
    dc.main(argv)
    df = pd.read_csv(tmp_path / "detector_cost.csv")
    assert list(df.columns) == dc.COLUMNS
    assert len(df) == 6
    # the first length is measured, the others estimated from it (any time exceeds 1e-6 min)
    assert df.groupby("tokens")["estimated"].all().to_dict() == {
        256: False, 320: True, 384: True}
    first = df.set_index(["detector", "tokens"])
    assert first.loc[("atp_prompt_end", 256), ["forwards", "backwards"]].tolist() == [2, 1]
    setup = json.loads((tmp_path / "setup.json").read_text())
    # a decode pass: 1 prefill and a step per token of the greedy response
    assert first.loc[("locos", 256), "forwards"] == 1 + setup["trials"]["256"]["n_new"]
    dc.main([*argv, "--resume"])  # measured cells kept, not run again
    again = pd.read_csv(tmp_path / "detector_cost.csv").set_index(["detector", "tokens"])
    assert again.loc[("locos", 256), "seconds"] == first.loc[("locos", 256), "seconds"]
    assert (tmp_path / "detector_cost.html").exists()
