"""The paper's protocol (`locos reproduce`, :mod:`locos_tl.experiments.protocol`): when
the trial files are rebuilt (growing a run), the ablation workers' niceness, the
resumable compression sweep, the report's tables, what is published and resuming a
published run elsewhere."""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from locos_tl.errors import ConfigError

#: in dependency order: a name is found in the module that defines it
PARTS = ("common", "tables", "stages", "causal", "report", "main")


class _Protocol:
    """The protocol's modules as one namespace (``util`` is its helpers' module, where a
    test patches ``_load``)."""

    def __init__(self) -> None:
        mods = [importlib.import_module(f"locos_tl.experiments.protocol.{p}") for p in PARTS]
        object.__setattr__(self, "_mods", mods)

    def _home(self, name: str):
        for m in self._mods:
            if name in vars(m):
                return m
        raise AttributeError(name)

    def __getattr__(self, name: str):
        return getattr(self._home(name), name)

    @staticmethod
    def parse_args(argv: list[str]):
        """The configuration ``locos reproduce <argv>`` runs, parsed by the command."""
        from locos_tl.cli.reproduce import parse_config

        return parse_config(argv)



@pytest.fixture(scope="module")
def script():
    return _Protocol()


def test_experiment_script_is_a_wrapper_of_the_library_command():
    import runpy

    source = (Path(__file__).resolve().parents[1] / "experiments" / "real_models.py")
    ns = runpy.run_path(str(source), run_name="not_main")
    from locos_tl.cli import app

    assert ns["app"] is app and len(source.read_text().splitlines()) < 15


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
    import locos_tl.experiments.evaluate as sweeps  # where the protocol imports it from

    calls = []
    monkeypatch.setattr(sweeps, "ablation_sweep",
                        lambda model, trials, sets, **kw: calls.append(kw))
    monkeypatch.setattr(script.util, "_load", lambda path: [])
    args = script.parse_args(["--model", "smollm2-135m-instruct", "--out", str(tmp_path),
                              "--workers", str(workers), "--questions", "direct"])
    script.ablate(None, args, tmp_path, {}, means=None)
    assert len(calls) == 3  # direct at one length, then the two controls
    for kw in calls:
        if workers > 1:
            assert isinstance(kw["workers"], lt.RayWorkers) and kw["workers"].n == workers
            env = kw["workers"].ray_init_kwargs["runtime_env"]["env_vars"]
            assert env == {"RAY_worker_niceness": "0"}
        else:
            assert kw["workers"] == 1


def test_methods_baseline_generates_the_unablated_answers_only(script, tmp_path,
                                                              monkeypatch) -> None:
    """``--methods baseline``: every evaluate call (the evaluation trials and both
    controls) gets no head set, no random and no bottom-k, so its one cell is the
    baseline; the report's grid is then that cell alone. An unknown method is refused."""
    import locos_tl as lt
    import locos_tl.experiments.evaluate as sweeps  # where the protocol imports it from
    from locos_tl.experiments.ablation_plan import build_jobs

    calls = []
    monkeypatch.setattr(sweeps, "ablation_sweep",
                        lambda model, trials, sets, **kw: calls.append((sets, kw)))
    monkeypatch.setattr(script.util, "_load", lambda path: [])
    argv = ["--model", "smollm2-135m-instruct", "--out", str(tmp_path), "--questions",
            "onehop", "--eval-lengths", "2000", "--methods", "baseline"]
    args = script.parse_args(argv)
    ranking = lt.HeadScores(method="locos", trial_scores=torch.rand(3, 30, 9))  # SmolLM2's
    script.ablate(None, args, tmp_path, {"locos": ranking}, means=None)
    assert len(calls) == 3
    for sets, kw in calls:
        assert sets == {} and kw["random"] is False and kw["bottom"] is None
        jobs = build_jobs(sets, kw["k"], n_layers=30, n_heads=9, seeds=kw["seeds"],
                          random=kw["random"], bottom=kw["bottom"])
        assert [(j.method, j.k) for j in jobs] == [("baseline", 0)]
    assert script.job_keys(args, {"locos": ranking}, 30, 9) == {("baseline", 0, 0): "none"}
    full = script.parse_args(argv[:-2] + ["--methods", "locos"])
    assert len(script.job_keys(full, {"locos": ranking}, 30, 9)) == 1 + 5 * (1 + 3 + 1)
    with pytest.raises(ConfigError, match="unknown --methods entry 'wu_nolima'") as exc:
        script.rankings_for_ablation({"locos": ranking}, "locos,wu_nolima")  # the old name
    assert f"choose from {', '.join(script.RANKINGS)}, or 'baseline'" in str(exc.value)
    # a ranking that accepted no detection trial (a model that rarely answers) is left
    # out; without LOCOS there is no bottom-k control, and with nothing ranked only the
    # baseline runs (no error)
    calls.clear()
    empty = lt.HeadScores(method="locos", trial_scores=torch.rand(0, 30, 9))
    dla = lt.HeadScores(method="dla", trial_scores=torch.rand(3, 30, 9))
    some = script.parse_args(argv[:-2] + ["--methods", "locos,dla"])
    script.ablate(None, some, tmp_path, {"locos": empty, "dla": dla}, means=None)
    assert [list(sets) for sets, _ in calls] == [["dla"]] * 3
    assert all(kw["bottom"] is None and kw.get("random", True) for _, kw in calls)
    assert ("locos_bottom", 5, 0) not in script.job_keys(some, {"locos": empty, "dla": dla},
                                                        30, 9)
    calls.clear()
    script.ablate(None, some, tmp_path, {"locos": empty}, means=None)
    assert all(sets == {} and kw["random"] is False for sets, kw in calls)


def test_compression_sweep_resumes_per_trial_and_fraction(script, tmp_path, monkeypatch):
    """A rerun decodes only the (trial, fraction) pairs the CSV lacks; trials or
    fractions no longer selected, and runs over other rankings, move aside."""
    from types import SimpleNamespace

    import locos_tl.experiments.compress as compress_mod

    @dataclasses.dataclass
    class Trial:
        trial_id: str
        meta: dict

    pool = {q: [Trial(f"{q}{i}", {}) for i in range(6)] for q in ("onehop", "direct")}
    monkeypatch.setattr(script.util, "_load", lambda path: pool[path.stem.split("_")[1]])
    calls = []

    def sweep(model, trials, rankings, fractions, **kw):
        (t,) = trials
        calls.append((t.trial_id, tuple(fractions)))
        names = [*rankings, *kw["include"]]
        return pd.DataFrame([{"ranking": r, "fraction": f, "task": t.meta["task"],
                              "trial": t.trial_id, "answer_correct": True}
                             for f in fractions for r in names])

    monkeypatch.setattr(compress_mod, "compression_sweep", sweep)
    ranking = SimpleNamespace(scores=torch.zeros(2, 3), n_trials=4)
    scores = {"locos": ranking, "wu": ranking, "headkv": SimpleNamespace(n_trials=0)}

    def run(n, fractions, scores=scores):
        calls.clear()
        args = script.parse_args(["--model", "smollm2-135m-instruct", "--out",
                                  str(tmp_path), "--n-compress", str(n),
                                  "--fractions", fractions])
        script.compress(None, args, tmp_path, scores)
        return pd.read_csv(tmp_path / "compress" / "compression.csv", dtype={"trial": str})

    df = run(4, "0.1,0.5")
    assert calls == [(t, (0.1, 0.5)) for t in ("onehop0", "onehop1", "direct0", "direct1")]
    assert len(df) == 4 * 2 * 4  # trials x fractions x (locos, wu, uniform, random)
    assert run(4, "0.1,0.5").shape == df.shape and calls == []  # nothing left to do
    df = run(6, "0.1,0.5,1.0")  # grow the sample and add the full cache
    assert sorted(calls) == sorted([(t, (1.0,)) for t in ("onehop0", "onehop1", "direct0",
                                                          "direct1")]
                                   + [(t, (0.1, 0.5, 1.0)) for t in ("onehop2", "direct2")])
    assert len(df) == 6 * 3 * 4 and not df.duplicated(["trial", "fraction", "ranking"]).any()
    index = dict(zip(df.trial, df.trial_index, strict=False))
    assert [index[t] for t in ("onehop0", "onehop2", "direct0", "direct2")] == [0, 2, 3, 5]
    df = run(4, "0.5")  # fewer trials and fractions: the rest moves aside, kept
    assert calls == [] and set(df.fraction) == {0.5} and len(df) == 4 * 4
    prev = tmp_path / "compress" / "compression.previous.csv"
    assert len(pd.read_csv(prev)) == 6 * 3 * 4 - 4 * 4
    other = dict(scores, locos=SimpleNamespace(scores=torch.ones(2, 3), n_trials=4))
    df = run(4, "0.5", scores=other)  # another LOCOS ranking: everything reruns
    assert len(calls) == 4 and len(df) == 4 * 4
    assert len(pd.read_csv(prev)) == 6 * 3 * 4


def test_compression_accuracy_counts_trials(script) -> None:
    df = pd.DataFrame({"ranking": ["locos"] * 4 + ["wu"] * 4, "fraction": 0.5,
                       "task": ["direct", "direct", "onehop", "onehop"] * 2,
                       "answer_correct": [True, False, False, False, True, True, True, False]})
    acc = script.compression_accuracy(df).set_index(["ranking", "task"])
    assert acc.loc[("locos", "direct"), "accuracy"] == 0.5
    assert acc.loc[("wu", "onehop"), "accuracy"] == 0.5
    assert (acc["n_trials"] == 2).all()
    assert acc.loc[("wu", "direct"), ["ci_low", "ci_high"]].tolist() == [1.0, 1.0]


def test_report_table_is_rebuilt_from_the_records_of_every_call(script, tmp_path) -> None:
    """The report's table is rebuilt from the run's records for the grid it is given, so
    sweeps on different grids report together (also for runs without ``jobs.json``). It
    equals each call's own table and the library's, and leaves out a job with a missing
    trial."""
    from planted import PLANTED, build_planted, planted_trials

    from locos_tl.experiments.ablation_plan import build_jobs
    from locos_tl.experiments.evaluate import ablation_sweep
    from locos_tl.models.load import load_model

    model = load_model(build_planted(tmp_path / "m"), device="cpu")
    trials = planted_trials(model.tokenizer, 3)
    sets = {"locos": [PLANTED, (0, 0)], "other": [(0, 1), (0, 0)]}
    kw = dict(mode="output_zero", seeds=(0,), bottom=None, max_new_tokens=2,
              progress=False, out_dir=tmp_path / "run")
    first = ablation_sweep(model, trials, {"locos": sets["locos"]}, k=(1,), random=False, **kw)
    second = ablation_sweep(model, trials, sets, k=(2,), **kw)  # another grid, same run
    (tmp_path / "run" / "jobs.json").unlink()  # as the runs published before it
    L, H = int(model.cfg.n_layers), int(model.cfg.n_heads)
    keys = {(j.method, j.k, j.seed): j.key  # the union grid: k 1 and 2 of every set
            for j in build_jobs(sets, (1, 2), n_layers=L, n_heads=H, seeds=(0,),
                                bottom=None)}
    table = script.evaluation_table(tmp_path / "run", trials, "nolima", keys)
    cols = ["method", "k", "seed", "metric"]
    expected = pd.concat([first, second]).drop_duplicates(cols)  # baseline in both
    got = expected.merge(table, on=cols, suffixes=("", "_table"))
    assert len(got) == len(expected) == len(table)  # never-run jobs (other/random k 1) left out
    assert set(zip(table["method"], table["k"], strict=True)) == {
        ("baseline", 0), ("locos", 1), ("locos", 2), ("other", 2), ("random", 2)}
    assert got["value"].to_numpy() == pytest.approx(got["value_table"].to_numpy(), abs=1e-12)
    assert (got["n_trials"] == got["n_trials_table"]).all()
    assert ((table["ci_low"] <= table["value"] + 1e-12)
            & (table["value"] <= table["ci_high"] + 1e-12)).all()
    # a trial the records lack: every job is incomplete, so none is reported
    more = planted_trials(model.tokenizer, 4)
    assert script.evaluation_table(tmp_path / "run", more, "nolima", keys).empty
    library = pd.read_csv(tmp_path / "run" / "evaluation.csv")  # the directory's table
    both = library.merge(table, on=cols, suffixes=("", "_table"))
    assert len(both) == len(library) == len(table)
    assert both["value"].to_numpy() == pytest.approx(both["value_table"].to_numpy(),
                                                     abs=1e-12)


def test_headline_row_per_length_at_the_largest_k_that_was_run(script) -> None:
    """k_head where the grid has it; a length swept at one smaller k reports that k, not
    the baseline alone; random is the mean over its seeds."""

    def table(cells):
        return pd.DataFrame([{"method": m, "k": k, "seed": s, "metric": "rougeL",
                              "value": v, "n_trials": 60, "ci_low": v, "ci_high": v}
                             for m, k, s, v in cells])

    full = table([("baseline", 0, 0, 0.5), ("locos", 10, 0, 0.2), ("locos", 50, 0, 0.0),
                  ("random", 50, 0, 0.4), ("random", 50, 1, 0.2)])
    small = table([("baseline", 0, 0, 0.4), ("locos", 10, 0, 0.1), ("random", 10, 0, 0.3),
                   ("random", 10, 1, 0.1), ("random", 10, 2, 0.2)])
    head = script.headline({("direct", 1000): full, ("direct", 2000): small}, 50)
    got = {(r.length, r.method): (r.k, r.rougeL) for r in head.itertuples()}
    assert got[(1000, "locos")] == (50, 0.0)
    assert got[(1000, "random")] == (50, pytest.approx(0.3))
    assert got[(2000, "baseline")] == (0, 0.4)
    assert got[(2000, "locos")] == (10, 0.1)
    assert got[(2000, "random")] == (10, pytest.approx(0.2))
    assert head["paper_qwen3_8b"].isna().all()  # the paper's numbers are non-literal


def test_headline_random_interval_is_a_bootstrap_of_the_per_trial_seed_mean(script) -> None:
    """Random's interval resamples trials of the mean over seeds (not the mean of the
    seeds' own intervals); a seed that lacks a trial, or no per-trial values, leaves it
    empty; a single-seed ranking keeps its own interval."""
    rng = np.random.default_rng(3)
    vals = pd.DataFrame([{"method": "random", "k": 5, "seed": s, "heads_key": f"r{s}",
                          "trial": f"t{t}", "metric": "rougeL", "value": float(rng.random())}
                         for s in range(3) for t in range(12)]
                        + [{"method": "baseline", "k": 0, "seed": 0, "heads_key": "none",
                            "trial": f"t{t}", "metric": "rougeL", "value": float(t % 2)}
                           for t in range(12)])
    table = script.interval_table(vals)
    head = script.headline({("direct", 1000): table}, 5, {("direct", 1000): vals})
    rand = head.set_index("method").loc["random"]
    per_trial = vals[vals["method"] == "random"].groupby("trial")["value"].mean()
    lo, hi = script._bootstrap(per_trial.to_numpy())
    assert [rand["ci_low"], rand["ci_high"]] == pytest.approx([lo, hi], abs=1e-12)  # sum order
    assert rand["rougeL"] == pytest.approx(per_trial.mean(), abs=1e-12)
    assert rand["n_seeds"] == 3
    seeds = table[table["method"] == "random"]  # not what averaging bounds gives
    assert (lo, hi) != (seeds["ci_low"].mean(), seeds["ci_high"].mean())
    assert lo < rand["rougeL"] < hi
    base = head.set_index("method").loc["baseline"]
    own = table[table["method"] == "baseline"].iloc[0]
    assert (base["ci_low"], base["ci_high"]) == (own["ci_low"], own["ci_high"])
    ragged = vals.drop(vals.index[(vals["seed"] == 2) & (vals["trial"] == "t0")])
    for values in (None, {("direct", 1000): ragged}):
        r = script.headline({("direct", 1000): table}, 5, values).set_index("method")
        assert np.isnan(r.loc["random", "ci_low"]) and np.isnan(r.loc["random", "ci_high"])
        assert r.loc["random", "rougeL"] == pytest.approx(rand["rougeL"], abs=1e-12)


def test_publish_copies_the_cells_of_every_call_and_no_weights(script, tmp_path) -> None:
    """``jobs.json`` (every cell any ablate call asked for) is published beside
    ``meta.json`` (the last call's options only); tensors other than the calibration
    means, the run's own tables and settings stay behind."""
    out, dest = tmp_path / "run", tmp_path / "pub"
    files = {"ablate/direct_1000/jobs.json": '{"jobs": []}',
             "ablate/direct_1000/meta.json": "{}",
             "ablate/direct_1000/trials.jsonl": "",
             "ablate/direct_1000/evaluation_ci.csv": "method\n",
             "detect/scores.safetensors": "x", "ablate/direct_1000/evaluation.csv": "x",
             "compress/settings.json": "{}"}
    for name, text in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    script.publish(out, dest)
    copied = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}
    assert copied == {"ablate/direct_1000/jobs.json", "ablate/direct_1000/meta.json",
                      "ablate/direct_1000/trials.jsonl",
                      "ablate/direct_1000/evaluation_ci.csv"}
    assert (dest / "ablate/direct_1000/jobs.json").read_text() == '{"jobs": []}'


def test_a_published_run_goes_on_elsewhere_without_regenerating(script, tmp_path) -> None:
    """``--resume-from``: the published records, cells and calibration means let a run
    go on in a new run directory (another machine) with every generation reused. Means
    recalibrated elsewhere differ in their last bits and the run refuses them
    (``means_hash``), which is why the means are published."""
    import dataclasses as dc

    from planted import build_planted, planted_trials

    import locos_tl as lt
    from locos_tl.errors import LocosError

    model = lt.load_model(build_planted(tmp_path / "m"), device="cpu")
    trials = planted_trials(model.tokenizer, 3)
    means = lt.calibrate_means(model, ["alpha beta gamma delta", "the cat sat on a mat"])
    first = tmp_path / "first"
    means.save(first / "means.safetensors")
    sets = {"locos": [(0, 0), (0, 1)]}
    kw = dict(k=(1,), mode="query_mean", seeds=(0,), bottom=None, max_new_tokens=2,
              progress=False)
    lt.ablation_sweep(model, trials, sets, means=means, out_dir=first / "ablate" / "direct_1000",
                **kw)
    (first / "detect").mkdir()
    (first / "detect" / "trials.jsonl").write_text("{}\n")
    (first / "detect" / "scores.safetensors").write_text("x")  # not a resumable file
    script.publish(first, tmp_path / "pub")
    out = tmp_path / "second"
    copied = script.resume_from(tmp_path / "pub", out)
    assert set(copied) == {"means.safetensors", "detect/trials.jsonl",
                           "ablate/direct_1000/trials.jsonl", "ablate/direct_1000/jobs.json",
                           "ablate/direct_1000/meta.json"}
    assert script.resume_from(tmp_path / "pub", out) == []  # a file already there is kept
    seen: list[tuple[int, int]] = []
    again = lt.ablation_sweep(model, trials, sets, out_dir=out / "ablate" / "direct_1000",
                        means=lt.AblationMeans.load(out / "means.safetensors"),
                        on_resume=lambda n, total: seen.append((n, total)), **kw)
    assert seen == [(9, 9)]  # baseline, locos-1, random-1 on 3 trials: all reused
    assert set(again["method"]) == {"baseline", "locos", "random"}
    # the same means recalibrated on another CPU: one ulp off in one entry
    q = means.q.clone()
    q.view(-1)[0] = torch.nextafter(q.view(-1)[0], torch.tensor(float("inf")))
    with pytest.raises(LocosError, match="means_hash"):
        lt.ablation_sweep(model, trials, sets, out_dir=out / "ablate" / "direct_1000",
                    means=dc.replace(means, q=q), **kw)
    with pytest.raises(FileNotFoundError, match="holds no file"):
        script.resume_from(tmp_path / "m", tmp_path / "third")
    with pytest.raises(ConfigError, match="add the trials stage"):  # before any model load
        script.run_protocol(script.parse_args(["--out", str(tmp_path / "fourth"),
                                               "--resume-from", str(tmp_path / "pub"),
                                               "--stages", "ablate"]))


def test_published_cri_is_reused_not_patched_again(script, tmp_path, monkeypatch) -> None:
    """A run resumed from a directory published without CRI's per-trial records (every
    run published before they were) reuses ``heads/cri`` over the same trials instead of
    patching every head again; other trials, another greedy budget or records present
    (``patch_heads`` reuses them) do not take that path. ``publish`` now copies the
    records and ``resume_from`` brings them back."""
    from planted import build_planted, planted_trials

    import locos_tl as lt

    model = lt.load_model(build_planted(tmp_path / "m"), device="cpu")
    trials = planted_trials(model.tokenizer, 3)
    first = tmp_path / "first"
    cri = lt.patch_heads(model, trials[:2], out_dir=first / "patch", max_new_tokens=4,
                         progress=False)
    assert cri.n_trials == 2  # the planted model answers both
    cri.save(first / "heads" / "cri")
    args = script.parse_args(["--out", str(first), "--max-new-tokens", "4"])
    assert script.saved_cri(model, args, first, trials[:2]) is None  # records are here
    script.publish(first, tmp_path / "pub")
    assert (tmp_path / "pub" / "patch" / "trials.jsonl").exists()
    old = tmp_path / "old_pub"  # published before the records were
    script.publish(first, old)
    (old / "patch" / "trials.jsonl").unlink()
    (old / "patch" / "meta.json").unlink()
    out = tmp_path / "second"
    assert "patch/trials.jsonl" not in script.resume_from(old, out)
    import locos_tl.experiments.patching as patching  # where the protocol imports it from

    monkeypatch.setattr(patching, "patch_heads", lambda *a, **k: pytest.fail("patched again"))
    again = script.saved_cri(model, args, out, trials[:2])
    assert again is not None and again.trial_ids == cri.trial_ids
    torch.testing.assert_close(again.trial_scores, cri.trial_scores, rtol=0, atol=0)
    assert script.saved_cri(model, args, out, trials[:3]) is None  # --n-cri grew
    assert script.saved_cri(model, args, out, trials[1::-1]) is None  # another order
    other = script.parse_args(["--out", str(first), "--max-new-tokens", "8"])
    assert script.saved_cri(model, other, out, trials[:2]) is None
    assert "patch/trials.jsonl" in script.resume_from(tmp_path / "pub", tmp_path / "third")


def test_niah_detection_has_a_budget_its_sentence_answers_fit(script, tmp_path,
                                                              monkeypatch) -> None:
    """Wu on NIAH decodes its trials with ``--niah-max-new-tokens`` (default 50, the
    paper's scoring budget): NIAH answers are sentences of 16-25 tokens, and the NoLiMa
    detection budget (16, for a name) cut every one off, most before the trial gate
    (ROUGE-1 recall > 0.5) could pass: SmolLM2 was rejected on "... to take a walk in Chaoyang"
    (recall 0.47), which it completes at 30 tokens."""
    import locos_tl.experiments.score as scoring  # where the protocol imports it from

    calls = []

    def score(model, trials, methods, out_dir, max_new_tokens, batch_size):
        calls.append((Path(out_dir).name, methods, max_new_tokens))
        return {m: m for m in methods}

    monkeypatch.setattr(scoring, "score_methods", score)
    monkeypatch.setattr(script.util, "_load", lambda path: [])
    args = script.parse_args(["--out", str(tmp_path)])
    assert (args.niah_max_new_tokens, args.max_new_tokens, args.eval_max_new_tokens) == (50, 16, 16)
    res = script.detect(None, args, tmp_path)
    assert calls == [("detect", list(script.DETECTORS), 16), ("detect_niah", ["wu"], 50)]
    assert res["wu_niah"] == "wu"
    calls.clear()
    script.detect(None, script.parse_args(["--out", str(tmp_path),
                                           "--niah-max-new-tokens", "64"]), tmp_path)
    assert calls[1] == ("detect_niah", ["wu"], 64)


def _built_items(script, monkeypatch, tmp_path, argv):
    """The needle items of every NoLiMa trial file ``build_trials`` writes, by file name
    (the builders are stubbed: the tokenizer, the trials and the controls are not made)."""
    import types

    import locos_tl.data as data
    import locos_tl.data.hub as hub

    calls = []

    def nolima(tok, items, haystacks, **kw):
        calls.append(list(items))
        return [len(calls) - 1]

    saved: dict[str, list] = {}

    def save(trials, path):
        if trials and isinstance(trials[0], int):  # a NoLiMa file: its builder call
            saved[path.stem] = calls[trials[0]]

    monkeypatch.setattr(hub, "load_tokenizer", lambda name: None)
    monkeypatch.setattr(data, "build_nolima_trials", nolima)
    for name in ("build_niah_trials", "build_parametric_trials", "build_arithmetic_trials"):
        monkeypatch.setattr(data, name, lambda *a, **k: [])
    monkeypatch.setattr(data, "load_niah_probes", lambda path: [])
    monkeypatch.setattr(script.util, "_save", save)
    (tmp_path / "trials").mkdir()
    args = script.parse_args(["--out", str(tmp_path), "--n-calibration", "2", *argv])
    model = types.SimpleNamespace(cfg=types.SimpleNamespace(n_ctx=2048))
    script.build_trials(model, args, tmp_path)
    return args, saved


def test_detection_and_evaluation_trials_come_from_their_own_needle_sets(
        script, tmp_path, monkeypatch) -> None:
    from locos_tl.data import load_needle_set

    args, saved = _built_items(script, monkeypatch, tmp_path, [
        "--detect-needle-set", "hop_detect", "--eval-needle-set", "hop_eval",
        "--eval-lengths", "1000,2000"])
    assert sorted(saved) == ["detect_direct", "detect_onehop", "eval_direct_1000",
                             "eval_direct_2000", "eval_onehop_1000", "eval_onehop_2000"]
    sets = {s: {e.id: e for e in load_needle_set(s)} for s in ("hop_detect", "hop_eval")}
    for stem, items in saved.items():
        own = sets["hop_detect" if stem.startswith("detect") else "hop_eval"]
        assert {i.entry_id for i in items} == set(own), stem  # every entry, no other
        assert {i.question_type for i in items} == {stem.split("_")[1]}
        for i in items:  # the protocol's name halves still apply within each set
            half = 0 if stem.startswith("detect") else 1
            assert i.character_set == own[i.entry_id].character_set[half::2]
    # recorded, so a run with other sets rebuilds its trials
    sizes = script._trial_sizes(args)
    assert (sizes["detect_needle_set"], sizes["eval_needle_set"]) == ("hop_detect", "hop_eval")
    script._mark(tmp_path, "trials", {"seconds": 1.0, "sizes": sizes})
    assert not script._trials_changed(tmp_path, args)
    other = script.parse_args(["--out", str(tmp_path), "--detect-needle-set", "hop_detect",
                               "--eval-needle-set", "everyday"])
    assert script._trials_changed(tmp_path, other)


def test_one_needle_set_by_default_and_sizes_as_before(script, tmp_path, monkeypatch) -> None:
    from locos_tl.data import load_needle_set

    args, saved = _built_items(script, monkeypatch, tmp_path, [])
    everyday = {e.id for e in load_needle_set("everyday")}
    assert all({i.entry_id for i in items} == everyday for items in saved.values())
    assert (args.detect_needle_set, args.eval_needle_set) == ("everyday", "everyday")
    # a set named equal to --needle-set is not recorded: published sizes stay valid
    for argv in ([], ["--detect-needle-set", "everyday", "--eval-needle-set", "everyday"]):
        sizes = script._trial_sizes(script.parse_args(argv))
        assert "detect_needle_set" not in sizes and "eval_needle_set" not in sizes
        assert set(sizes) == set(script.TRIAL_OPTIONS)
    only_eval = script._trial_sizes(script.parse_args(["--eval-needle-set", "hop_eval"]))
    assert only_eval["eval_needle_set"] == "hop_eval" and "detect_needle_set" not in only_eval


def test_the_protocol_reads_its_rankings_from_the_registry(script) -> None:
    """The detect stage scores the registry's decode-pass methods but its variant
    (``headkv_anchor``): the five the published ``detect/`` records hold; ``--methods``
    takes each ranking by its registry name (Wu on NoLiMa is ``wu``), Wu on NIAH, and the
    own-pass methods but CRI (the patch stage's); every preset's rankings are among them."""
    import locos_tl as lt

    assert script.DETECTORS == ("locos", "wu", "attention_spatial", "headkv", "dla")
    assert script.OWN_PASS == ("atp", "qrhead") and script.PATCH_METHOD == "cri"
    assert script.RANKINGS == (*script.DETECTORS, "wu_niah", "atp", "qrhead")
    scores = {m: lt.HeadScores(method=m, trial_scores=torch.rand(2, 3, 4))
              for m in script.RANKINGS}
    for preset in script.PRESETS.values():
        names = preset["methods"].split(",")
        assert list(script.rankings_for_ablation(scores, preset["methods"])) == names
        assert "wu" in names and "wu_niah" in names
    with pytest.raises(ConfigError, match="unknown --methods entry 'cri'"):
        script.rankings_for_ablation(scores, "locos,cri")


def test_forward_methods_are_scored_and_ablated_only_when_asked(script, tmp_path,
                                                                monkeypatch) -> None:
    """``--methods ...,atp,qrhead``: the detect stage scores the two forward-pass
    detectors on the detection trials into ``detect/`` and the sweep ablates their
    rankings; the default methods leave them out (published runs unchanged)."""
    import locos_tl as lt
    import locos_tl.experiments.score as scoring

    calls = []

    def fake(model, trials, *, methods, out_dir, **kw):
        calls.append((list(methods), Path(out_dir).name))
        return {m: lt.HeadScores(method=m, trial_scores=torch.rand(2, 30, 9))
                for m in methods}

    monkeypatch.setattr(scoring, "score_methods", fake)
    monkeypatch.setattr(script.util, "_load", lambda path: [])
    base = ["--model", "smollm2-135m-instruct", "--out", str(tmp_path)]
    args = script.parse_args([*base, "--methods", "locos,dla,atp,qrhead"])
    res = script.detect(None, args, tmp_path)
    assert calls[-1] == (["atp", "qrhead"], "detect")
    assert set(script.rankings_for_ablation(res, args.methods)) == {"locos", "dla", "atp",
                                                                    "qrhead"}
    calls.clear()
    script.detect(None, script.parse_args(base), tmp_path)
    assert all("atp" not in m and "qrhead" not in m for m, _ in calls)
    assert script.forward_methods(script.parse_args(base).methods) == []


def test_reproduce_is_a_typer_command_with_help_on_every_option(script, tmp_path) -> None:
    """``locos reproduce`` has one option per :class:`ProtocolConfig` field, each with
    help; it builds the configuration Python builds, refuses a bad one with exit code 2
    before writing anything, and a published ``args.json`` reads back into the same
    options."""
    import typer.main
    from typer.testing import CliRunner

    from locos_tl.cli import app
    from locos_tl.experiments.protocol.config import ProtocolConfig

    command = typer.main.get_command(app).get_command(None, "reproduce")
    options = {p.name: p for p in command.params if p.param_type_name == "option"}
    fields = {f.name for f in dataclasses.fields(ProtocolConfig)} - {"model_hashes"}
    assert set(options) - {"help"} == fields
    assert all(p.help for p in options.values())
    res = CliRunner().invoke(app, ["reproduce", "--help"])
    assert res.exit_code == 0 and "--niah-max-new-tokens" in res.output
    assert script.parse_args(["--preset", "full", "--n-eval", "20", "--model", "a/b"]) == \
        ProtocolConfig(preset="full", n_eval=20, model="a/b")
    got = script.parse_args(["--preset", "full", "--n-eval", "20", "--model", "a/b"])
    assert (got.out, got.n_detect, got.ks) == ("runs/real/a_b", 80, "1,5,10,20,50")
    for argv, message in ((["--stages", "trials,detekt"], "unknown --stages entry ['detekt']"),
                          (["--methods", "locos,cri"], "unknown --methods entry 'cri'"),
                          (["--preset", "gpu"], "unknown --preset 'gpu'"),
                          (["--workers", "0"], "--workers must be >= 1")):
        res = CliRunner().invoke(app, ["reproduce", "--out", str(tmp_path / "r"), *argv])
        assert res.exit_code == 2 and message in res.output, (argv, res.output)
        assert not (tmp_path / "r").exists()
    published = Path(__file__).resolve().parents[1] / "docs" / "real_models"
    for path in sorted(published.rglob("args.json")):
        recorded = json.loads(path.read_text())
        back = ProtocolConfig.from_settings(recorded).settings()
        differ = {k for k in recorded if back.get(k) != recorded[k]}
        assert differ <= {"methods"}, (path, differ)  # wu_nolima reads as wu
        assert back["methods"] == recorded["methods"].replace("wu_nolima", "wu")
