"""Ablation sweeps, answer metrics and the dissociation score."""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from planted import PLANTED, build_planted, planted_trials

from locos_tl.experiments.ablation_plan import build_jobs
from locos_tl.experiments.dissociation import BASELINE, dissociation_score
from locos_tl.experiments.evaluate import ablation_sweep
from locos_tl.experiments.run_table import heads_key
from locos_tl.experiments.task_metrics import (
    babilong_substring,
    extract_answer_tag,
    musique_em_f1,
    nolima_contains,
    score_nolima,
)
from locos_tl.heads import HeadScores
from locos_tl.models.load import load_model
from locos_tl.trials import Trial


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    model = load_model(build_planted(tmp_path_factory.mktemp("planted") / "m"), device="cpu")
    return model, planted_trials(model.tokenizer, 2)


# -- metrics ---------------------------------------------------------------------------
def test_nolima_metrics() -> None:
    t = Trial(tokens=(1, 2, 3), needle_span=(0, 1), answer="Yuki",
              meta={"gold_answers": ["Yuki", "Yuki Tanaka"]})
    assert nolima_contains("  It is Yuki.", ["Yuki"]) == 1.0
    assert nolima_contains("it is yuki", ["Yuki"]) == 0.0  # case-sensitive, as NoLiMa
    s = score_nolima("The answer is Yuki", t)
    assert s["contains"] == 1.0
    assert s["rougeL"] == pytest.approx(2 * (1 / 4) * 1 / (1 / 4 + 1))  # P=1/4, R=1
    assert score_nolima("Katie", t) == {"rougeL": 0.0, "contains": 0.0}


def test_musique_em_f1_of_answer_tag() -> None:
    assert extract_answer_tag("think... <answer> The Eiffel Tower</answer> done") == \
        "The Eiffel Tower"
    assert extract_answer_tag("<answer>a</answer> then <answer>Paris") == "Paris"
    assert extract_answer_tag("Paris") == ""
    got = musique_em_f1("<answer>the Eiffel tower!</answer>", ["Eiffel Tower"])
    assert got == {"em": 1.0, "f1": 1.0}
    got = musique_em_f1("<answer>Eiffel Tower in Paris</answer>", ["Eiffel Tower"])
    assert got["em"] == 0.0 and got["f1"] == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert musique_em_f1("Eiffel Tower", ["Eiffel Tower"]) == {"em": 0.0, "f1": 0.0}


def test_babilong_substring() -> None:
    assert babilong_substring("The football is in the Kitchen.", ["kitchen"]) == 1.0
    assert babilong_substring("The football is in the garden.", ["kitchen"]) == 0.0


def test_dissociation_score() -> None:
    rows = lambda r0, r5, m: [  # noqa: E731
        {"method": BASELINE, "k": 0, "seed": 0, "metric": m, "value": r0, "n_trials": 4},
        {"method": "locos", "k": 5, "seed": 0, "metric": m, "value": r5, "n_trials": 4},
        {"method": "random", "k": 5, "seed": 0, "metric": m, "value": r0, "n_trials": 4},
        {"method": "random", "k": 5, "seed": 1, "metric": m, "value": r0 / 2, "n_trials": 4},
    ]
    ret = pd.DataFrame(rows(0.8, 0.2, "rougeL"))
    ctl = pd.DataFrame(rows(0.5, 0.4, "contains"))
    ds = dissociation_score(ret, ctl, control_metric="contains").set_index(["method", "k"])["ds"]
    assert ds[("locos", 5)] == pytest.approx((0.8 - 0.2) / 0.8 - (0.5 - 0.4) / 0.5)  # 0.55
    assert ds[("random", 5)] == pytest.approx(0.25 - 0.25)  # seeds averaged first
    with pytest.raises(ValueError, match="metric"):
        dissociation_score(ret, ctl, control_metric="em")


# -- sweep cells -----------------------------------------------------------------------
def test_build_jobs_cells_and_controls() -> None:
    scores = torch.arange(8, dtype=torch.float64).reshape(1, 2, 4)  # best = (1, 3)
    hs = HeadScores("locos", scores)
    jobs = build_jobs({"locos": hs, "wu": [(0, 1), (1, 0)]}, (0, 1, 3), n_layers=2,
                      n_heads=4, seeds=(0, 1))
    cells = {(j.method, j.k, j.seed): j.heads for j in jobs}
    assert cells[(BASELINE, 0, 0)] == ()
    assert cells[("locos", 3, 0)] == ((1, 3), (1, 2), (1, 1))
    assert cells[("locos_bottom", 1, 0)] == ((0, 0),)
    assert ("wu", 3, 0) not in cells  # ranking of 2 heads: k=3 skipped
    assert cells[("random", 1, 0)] == cells[("random", 3, 0)][:1]  # nested per seed
    assert cells[("random", 3, 0)] != cells[("random", 3, 1)]
    assert heads_key([(1, 2), (0, 1)]) == heads_key([(0, 1), (1, 2)])


# -- end to end on the planted retrieval head --------------------------------------------
def test_evaluate_planted_head_ablation_and_resume(planted, tmp_path, monkeypatch) -> None:
    model, trials = planted
    kw = dict(k=(1,), mode="output_zero", seeds=(0,), bottom=None, max_new_tokens=2,
              progress=False)
    df = ablation_sweep(model, trials, {"locos": [PLANTED], "other": [(0, 0)]}, out_dir=tmp_path,
                  **kw)
    assert list(df.columns) == ["method", "k", "seed", "metric", "value", "n_trials",
                                "ci_low", "ci_high"]  # ci=0.95 by default
    v = df.set_index(["method", "k", "metric"])["value"]
    assert v[(BASELINE, 0, "contains")] == 1.0 and v[(BASELINE, 0, "rougeL")] > 0.6
    assert v[("locos", 1, "contains")] == 0.0  # the copy head carried the answer
    assert v[("other", 1, "contains")] == 1.0
    assert set(df["n_trials"]) == {2}
    lines = (tmp_path / "trials.jsonl").read_text().splitlines()
    n_sets = len({json.loads(x)["heads_key"] for x in lines})
    assert len(lines) == 2 * n_sets
    assert json.loads((tmp_path / "meta.json").read_text())["settings"]["mode"] == "output_zero"

    def no_decoding(*a, **k):
        raise AssertionError("a finished generation was rerun")

    # patch the module through sys.modules
    monkeypatch.setattr(sys.modules["locos_tl.experiments.evaluate"], "greedy_decode", no_decoding)
    meta = (tmp_path / "meta.json").read_text()
    again = ablation_sweep(model, trials, {"locos": [PLANTED], "other": [(0, 0)]},
                     out_dir=tmp_path, **kw)
    pd.testing.assert_frame_equal(df, again)
    # a call that generates nothing (here on one of the two rankings) keeps the
    # provenance of the call that did: meta.json still lists both methods
    fewer = ablation_sweep(model, trials, {"locos": [PLANTED]}, out_dir=tmp_path, **kw)
    pd.testing.assert_frame_equal(fewer, df[df["method"] != "other"].reset_index(drop=True))
    assert (tmp_path / "meta.json").read_text() == meta
    assert json.loads(meta)["settings"]["methods"] == [BASELINE, "locos", "other", "random"]


def test_a_sweep_records_its_options_and_reads_them_back(planted, tmp_path) -> None:
    """``meta.json``'s settings are the sweep's :class:`AblationOptions` (the keys sweeps
    have always recorded, with the same values; ``ks`` and ``seeds`` as planned), read
    back into the same options; an options object and its keywords sweep alike; the
    sweep's decoding defaults (100 tokens, 1024-token chunks) are the object's."""
    from locos_tl.engine.options import DecodeOptions
    from locos_tl.experiments.options import ABLATION_DECODE, AblationOptions

    model, trials = planted
    options = AblationOptions(k=[1], mode="output_zero", seeds=[0], bottom=None,
                              decode=DecodeOptions(max_new_tokens=2, stop_rule="none"))
    assert options.k == (1,) and options.seeds == (0,)  # lists kept as tuples
    sets = {"locos": [PLANTED], "other": [(0, 0)]}
    df = ablation_sweep(model, trials, sets, options, out_dir=tmp_path, progress=False)
    settings = json.loads((tmp_path / "meta.json").read_text())["settings"]
    assert {k: settings[k] for k in ("mode", "max_new_tokens", "stop_at_newline", "stop_rule",
                                     "thinking", "reuse_prefix", "scorer", "ks", "seeds")} == {
        "mode": "output_zero", "max_new_tokens": 2, "stop_at_newline": False,
        "stop_rule": "none", "thinking": True, "reuse_prefix": True, "scorer": "nolima",
        "ks": [1], "seeds": [0]}
    back = AblationOptions.from_settings(settings)
    assert back.decode == DecodeOptions(max_new_tokens=2, stop_rule="none")
    assert (back.k, back.seeds, back.mode, back.bottom) == ((1,), (0,), "output_zero", None)
    kw = ablation_sweep(model, trials, sets, k=1, mode="output_zero", seeds=0, bottom=None,
                        max_new_tokens=2, stop_rule="none", progress=False)
    pd.testing.assert_frame_equal(kw, df)
    assert AblationOptions().decode == ABLATION_DECODE
    assert (ABLATION_DECODE.max_new_tokens, ABLATION_DECODE.chunk_size) == (100, 1024)
    with pytest.raises(ValueError, match="unknown scorer 'rouge'"):
        AblationOptions(scorer="rouge")


def test_evaluate_extend_grows_a_run_keeping_its_generations(planted, tmp_path,
                                                             monkeypatch) -> None:
    from locos_tl.errors import LocosError

    model, trials = planted
    kw = dict(k=(1,), mode="output_zero", seeds=(0,), bottom=None, max_new_tokens=2,
              progress=False)
    sets = {"locos": [PLANTED], "other": [(0, 0)]}
    fresh = ablation_sweep(model, trials, sets, **kw)  # no run directory: the reference
    run = tmp_path / "run"
    ablation_sweep(model, trials[:1], sets, out_dir=run, **kw)
    first = (run / "trials.jsonl").read_text()
    with pytest.raises(LocosError, match="another trial set"):  # growth is opt-in
        ablation_sweep(model, trials, sets, out_dir=run, **kw)
    with pytest.raises(LocosError, match="cannot be extended"):  # trial 0 is not given
        ablation_sweep(model, trials[1:], sets, out_dir=run, extend=True, **kw)
    assert (run / "trials.jsonl").read_text() == first  # nothing written by either

    calls = []
    real = sys.modules["locos_tl.experiments.evaluate"].greedy_decode

    def counting(m, tokens, **k):
        calls.append(tuple(tokens))
        return real(m, tokens, **k)

    monkeypatch.setattr(sys.modules["locos_tl.experiments.evaluate"], "greedy_decode", counting)
    grown = ablation_sweep(model, trials, sets, out_dir=run, extend=True, **kw)
    n_sets = len({json.loads(x)["heads_key"] for x in first.splitlines()})
    assert len(calls) == n_sets and set(calls) == {tuple(trials[1].tokens)}  # only new
    pd.testing.assert_frame_equal(grown, fresh)
    assert set(grown["n_trials"]) == {2}
    assert json.loads((run / "meta.json").read_text())["settings"]["n_trials"] == 2


def test_run_directory_reads_back_every_call_as_one_table(planted, tmp_path) -> None:
    """Calls on different grids grow one directory; ``evaluation.csv`` and
    ``load_ablation_sweep`` hold every cell, each equal to the call that made it, and a cell
    without every trial is left out (not averaged over fewer)."""
    from locos_tl.errors import LocosError
    from locos_tl.experiments.run_table import load_ablation_sweep, read_jobs

    model, trials = planted
    kw = dict(mode="output_zero", seeds=(0,), bottom=None, max_new_tokens=2,
              progress=False, out_dir=tmp_path / "run")
    sets = {"locos": [PLANTED, (0, 0)], "other": [(0, 1), (0, 0)]}
    first = ablation_sweep(model, trials, {"locos": sets["locos"]}, k=(1,), random=False, **kw)
    second = ablation_sweep(model, trials, sets, k=(2,), **kw)
    cells = {(j["method"], j["k"], j["seed"]) for j in read_jobs(tmp_path / "run")}
    assert cells == {(BASELINE, 0, 0), ("locos", 1, 0), ("locos", 2, 0), ("other", 2, 0),
                     ("random", 2, 0)}
    cols = ["method", "k", "seed", "metric"]
    made = (pd.concat([first, second]).drop_duplicates(cols).sort_values(cols)
            .drop(columns=["ci_low", "ci_high"]))  # the directory's table has no intervals
    table = load_ablation_sweep(tmp_path / "run", trials).sort_values(cols)
    on_disk = pd.read_csv(tmp_path / "run" / "evaluation.csv").sort_values(cols)
    for got in (table, on_disk):  # the first call's k = 1 survives the second call
        pd.testing.assert_frame_equal(got.reset_index(drop=True), made.reset_index(drop=True),
                                      check_exact=got is table, rtol=1e-15)
    per = load_ablation_sweep(tmp_path / "run", trials, per_trial=True)
    assert len(per) == len(table) * len(trials)
    means = per.groupby(cols)["value"].mean().sort_index()
    assert means.to_numpy() == pytest.approx(
        table.set_index(cols)["value"].sort_index().to_numpy(), abs=1e-12)
    # a custom scorer reads the same records (responses are stored, not scores)
    lens = load_ablation_sweep(tmp_path / "run", trials, lambda r, t: {"chars": len(r)})
    assert set(lens["metric"]) == {"chars"} and len(lens) == len(cells)
    assert load_ablation_sweep(tmp_path / "run", trials[:1])["n_trials"].eq(1).all()
    more = planted_trials(model.tokenizer, 3)  # a trial no generation covers
    with pytest.warns(UserWarning, match="no cell recorded"):
        assert load_ablation_sweep(tmp_path / "run", more).empty
    with pytest.raises(LocosError, match="no jobs.json"):
        load_ablation_sweep(tmp_path / "empty", trials)


def test_a_cell_under_an_old_method_name_is_read_under_the_registered_one(planted,
                                                                         tmp_path) -> None:
    """The published runs call Wu's ranking ``wu_nolima`` in ``jobs.json``: read back,
    its cells are ``wu``'s, and a sweep of ``wu`` over that directory reuses their
    generations and writes the registered name."""
    from locos_tl.experiments.run_table import load_ablation_sweep, read_jobs

    model, trials = planted
    run = tmp_path / "run"
    kw = dict(mode="output_zero", random=False, bottom=None, max_new_tokens=2,
              progress=False, out_dir=run)
    first = ablation_sweep(model, trials, {"wu": [PLANTED, (0, 0)]}, k=(1,), **kw)
    path = run / "jobs.json"
    path.write_text(path.read_text().replace('"wu"', '"wu_nolima"'))  # as published
    assert '"wu_nolima"' in path.read_text()
    assert [(j["method"], j["k"]) for j in read_jobs(run)] == [(BASELINE, 0), ("wu", 1)]
    cols = ["method", "k", "seed", "metric", "value", "n_trials"]
    pd.testing.assert_frame_equal(load_ablation_sweep(run, trials), first[cols])
    seen = []
    ablation_sweep(model, trials, {"wu": [PLANTED, (0, 0)]}, k=(1,), **kw,
             on_resume=lambda n, total: seen.append((n, total)))
    assert seen == [(2 * len(trials), 2 * len(trials))]  # every generation reused
    assert '"wu_nolima"' not in path.read_text() and '"wu"' in path.read_text()


def test_run_directory_keeps_one_ranking_per_curve_and_survives_a_bad_jobs_file(
        planted, tmp_path) -> None:
    """A ranking scored anew drops the earlier cells it contradicts (warned), never mixes
    two rankings in one curve, and keeps a cell whose head set only changed order (Wu on
    NIAH detected again on Gemma-3-270m: its top 5 swapped its first two heads); an
    unreadable jobs.json is a clear error before anything
    is written; extend warns about the cells it leaves short; a custom scorer's numpy
    values give the same numbers in the table and the returned frame."""
    from locos_tl.errors import LocosError
    from locos_tl.experiments.run_table import load_ablation_sweep, read_jobs

    model, trials = planted
    run = tmp_path / "run"
    kw = dict(mode="output_zero", random=False, bottom=None, max_new_tokens=2,
              progress=False, out_dir=run)
    a, b = [PLANTED, (0, 0), (0, 1)], [PLANTED, (0, 1), (1, 1)]
    ablation_sweep(model, trials, {"locos": a}, k=(1, 3), **kw)
    with pytest.warns(UserWarning, match=r"earlier cell\(s\) leave its table \(locos k=3\)"):
        ablation_sweep(model, trials, {"locos": b}, k=(2,), **kw)  # b[:1] == a[:1]: k = 1 stays
    cells = {(j["method"], j["k"]): j["heads"] for j in read_jobs(run)}
    assert cells == {(BASELINE, 0): [], ("locos", 1): [list(PLANTED)],
                     ("locos", 2): [list(h) for h in b[:2]]}
    same = tmp_path / "same"  # a[:3] in another order: the cell stays, nothing is generated
    ablation_sweep(model, trials, {"locos": a}, k=(3,), **dict(kw, out_dir=same))
    c, seen = [(0, 1), PLANTED, (0, 0)], []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ablation_sweep(model, trials, {"locos": c}, k=(3,), **dict(kw, out_dir=same),
                 on_resume=lambda n, total: seen.append((n, total)))
    assert seen == [(2 * len(trials), 2 * len(trials))]  # baseline and locos-3, all reused
    cells = {(j["method"], j["k"]): j["heads"] for j in read_jobs(same)}
    assert cells == {(BASELINE, 0): [], ("locos", 3): [list(h) for h in c]}

    meta = (run / "meta.json").read_text()
    (run / "jobs.json").write_text('{"jobs": [{"method": "locos"')  # a cut file
    with pytest.raises(LocosError, match="jobs.json is not a readable"):
        ablation_sweep(model, trials, {"locos": b}, k=(2,), **kw)
    with pytest.raises(LocosError, match="jobs.json is not a readable"):
        load_ablation_sweep(run, trials)
    assert (run / "meta.json").read_text() == meta  # nothing rewritten

    grown = tmp_path / "grown"
    ablation_sweep(model, trials[:1], {"locos": a}, k=(1, 2), **dict(kw, out_dir=grown))
    with pytest.warns(UserWarning, match=r"1 cell\(s\) .* left out of evaluation.csv "
                                         r"\(locos k=2\)"):
        ablation_sweep(model, trials, {"locos": a}, k=(1,), extend=True, **dict(kw, out_dir=grown))
    assert set(pd.read_csv(grown / "evaluation.csv")["k"]) == {0, 1}

    def f32(response, trial):  # a scorer returning numpy float32
        return {"chars": np.float32(len(response) / 3)}

    own = ablation_sweep(model, trials, {"locos": a}, k=(1,), scorer=f32,
                   **dict(kw, out_dir=tmp_path / "f32"))
    table = load_ablation_sweep(tmp_path / "f32", trials, f32)
    assert own["value"].tolist() == table["value"].tolist()

    from locos_tl.experiments.run_table import AblationJob, record_jobs

    stale = tmp_path / "stale"  # an attempt that recorded its cells, then never generated
    stale.mkdir()
    record_jobs(stale, [AblationJob("old", 1, 0, ((0, 1),))])
    ablation_sweep(model, trials, {"locos": a}, k=(1,), **dict(kw, out_dir=stale))
    assert {j["method"] for j in read_jobs(stale)} == {BASELINE, "locos"}


def test_evaluate_refuses_a_run_made_in_another_dtype(planted, tmp_path) -> None:
    from locos_tl.errors import LocosError

    model, trials = planted
    kw = dict(k=(1,), mode="output_zero", random=False, bottom=None, max_new_tokens=2,
              progress=False)
    ablation_sweep(model, trials[:1], {"locos": [PLANTED]}, out_dir=tmp_path, **kw)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["settings"]["dtype"] == "float32"
    meta["settings"]["dtype"] = "bfloat16"  # as a bf16 session would have written it
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(LocosError, match="dtype: 'bfloat16' != 'float32'"):
        ablation_sweep(model, trials, {"locos": [PLANTED]}, out_dir=tmp_path, extend=True, **kw)


def test_query_zero_on_planted_head_breaks_retrieval(planted) -> None:
    model, trials = planted
    df = ablation_sweep(model, trials[:1], {"locos": [PLANTED]}, k=(1,), mode="query_zero",
                  random=False, bottom=None, max_new_tokens=1, progress=False)
    v = df.set_index(["method", "metric"])["value"]
    assert v[(BASELINE, "contains")] == 1.0 and v[("locos", "contains")] == 0.0


def test_mean_mode_without_means_raises(planted) -> None:
    model, trials = planted
    with pytest.raises(ValueError, match="calibration means"):
        ablation_sweep(model, trials, {"x": [PLANTED]}, mode="query_mean", progress=False)


def test_unusable_head_sets_fail_before_generation(planted, monkeypatch) -> None:
    import torch

    from locos_tl.heads import HeadScores

    model, trials = planted
    L, H = model.cfg.n_layers, model.cfg.n_heads
    import sys

    monkeypatch.setattr(sys.modules["locos_tl.experiments.evaluate"], "greedy_decode",
                        lambda *a, **k: pytest.fail("generation started"))
    with pytest.raises(ValueError, match=r"head \(9, 0\) is outside the model"):
        ablation_sweep(model, trials, {"x": [(9, 0)]}, k=(1,), mode="query_zero", progress=False)
    other = HeadScores(method="locos", trial_scores=torch.ones(2, L + 1, H))
    with pytest.raises(ValueError, match="the model has"):
        ablation_sweep(model, trials, {"locos": other}, k=(1,), mode="query_zero", progress=False)
    empty = HeadScores(method="locos", trial_scores=torch.zeros(0, L, H))
    with pytest.raises(ValueError, match="no accepted trial"):
        ablation_sweep(model, trials, {"locos": empty}, k=(1,), mode="query_zero", progress=False)


def test_cli_ablate(planted, tmp_path) -> None:
    from typer.testing import CliRunner

    from locos_tl.cli import app
    from locos_tl.trials import save_trials

    model, trials = planted
    save_trials(trials, tmp_path / "trials.jsonl")
    hs = HeadScores("locos", torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 5.0, 0.0]]]))
    hs.save(tmp_path / "locos")
    ckpt = model.original_model.config._name_or_path
    res = CliRunner().invoke(app, [
        "ablate", "--model", ckpt, "--heads", str(tmp_path / "locos"), "--trials",
        str(tmp_path / "trials.jsonl"), "--k", "1", "--mode", "query_mean", "--seeds", "0",
        "--max-new-tokens", "1", "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    out = tmp_path / "run"
    for f in ("evaluation.csv", "meta.json", "ablation.html", "means.safetensors"):
        assert (out / f).exists(), f
    df = pd.read_csv(out / "evaluation.csv")
    assert set(df["method"]) == {BASELINE, "locos", "random", "locos_bottom"}


def test_ablation_sweep_intervals_bracket_the_mean_and_are_reproducible(planted,
                                                                        tmp_path) -> None:
    """``ci``: each cell's percentile bootstrap interval over its trials (seed 0), the
    protocol's bootstrap on the per-trial records; the same on a rerun; ``None``: the
    table without interval columns."""
    from locos_tl.experiments.run_table import load_ablation_sweep
    from locos_tl.experiments.stats import bootstrap_ci

    model, two = planted
    trials = planted_trials(model.tokenizer, 6)
    order = {t.trial_id: i for i, t in enumerate(trials)}

    def scorer(response, trial):  # a metric that varies over trials: a real interval
        return {**score_nolima(response, trial), "idx": float(order[trial.trial_id])}

    kw = dict(k=(1,), mode="output_zero", seeds=(0, 1), bottom=None, max_new_tokens=2,
              progress=False, scorer=scorer, out_dir=tmp_path)
    sets = {"locos": [PLANTED]}
    df = ablation_sweep(model, trials, sets, **kw)
    assert {"ci_low", "ci_high"} <= set(df.columns)
    assert (df["ci_low"] <= df["value"] + 1e-12).all()
    assert (df["value"] <= df["ci_high"] + 1e-12).all()
    idx = df[df["metric"] == "idx"]
    assert (idx["ci_low"] < idx["value"]).all() and (idx["value"] < idx["ci_high"]).all()
    per = load_ablation_sweep(tmp_path, trials, scorer, per_trial=True)
    for row in df.itertuples():
        v = per[(per["method"] == row.method) & (per["k"] == row.k)
                & (per["seed"] == row.seed) & (per["metric"] == row.metric)]["value"]
        assert (row.ci_low, row.ci_high) == bootstrap_ci(v.to_numpy(), 0.95)
    again = ablation_sweep(model, trials, sets, **kw)  # records reused: the same intervals
    pd.testing.assert_frame_equal(df, again)
    narrow = ablation_sweep(model, trials, sets, ci=0.5, **kw)
    assert (narrow["ci_high"] - narrow["ci_low"] <= df["ci_high"] - df["ci_low"] + 1e-12).all()
    plain = ablation_sweep(model, trials, sets, ci=None, **kw)
    pd.testing.assert_frame_equal(plain, df.drop(columns=["ci_low", "ci_high"]))
    assert list(pd.read_csv(tmp_path / "evaluation.csv").columns) == list(plain.columns)
    with pytest.raises(ValueError, match="confidence level"):
        ablation_sweep(model, two, sets, ci=1.5, **{**kw, "out_dir": None})
