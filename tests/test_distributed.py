"""Data-parallel scoring on Ray: identical scores, worker death, resume.

One local Ray cluster (2 CPUs, no dashboard) and one warm pool of 2 workers are shared
by the module: starting Ray and importing torch in two actors costs ~30 s on a 2-core
machine. The pool fixture is the pool's own local cluster, so its teardown also checks
that a cluster started by locos_tl is shut down again. The worker-killing test runs
last (it leaves the pool one worker short).

Runs on the shipped organism when ``data/organisms/<name>/`` exists, else on the tiny
random-init Qwen3 (with trials whose answers are the model's own responses).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pytest
import torch
from tolerances import assert_close_within, model_tol

from locos_tl import Trial, load_model, score_methods, score_trials
from locos_tl.runs.distributed import RAY_INSTALL_HINT, DistributedError
from locos_tl.runs.records import RECORDS_FILE

METHODS = ["locos", "wu", "dla"]
MAX_NEW = 6


def _organism_dir() -> Path | None:
    try:
        from locos_tl.organisms import SMALL_ORGANISM
    except ImportError:
        return None
    p = Path(SMALL_ORGANISM)
    return p if (p / "config.json").exists() else None


@pytest.fixture(scope="module")
def setup(tiny_dirs, own_answer_trials):
    """(model path, loaded bridge, 6 trials: accepted ones and gate-dropped ones)."""
    org = _organism_dir()
    if org is not None:
        from locos_tl.organisms import make_trials

        model = load_model(org, device="cpu")
        trials = make_trials("literal", 3, 64) + make_trials("nonliteral", 3, 64)
        return org, model, trials
    path = tiny_dirs["qwen3"]
    model = load_model(path, device="cpu")
    g = torch.Generator().manual_seed(7)
    dropped = [
        Trial(tokens=torch.randint(1, int(model.cfg.d_vocab) - 1, (30,), generator=g).tolist(),
              needle_span=(3, 8), answer="Zebediah")
        for _ in range(3)
    ]
    return path, model, [*own_answer_trials, *dropped]


@pytest.fixture(scope="module")
def reference(setup, tmp_path_factory):
    """Single-process scores and run directory, with 1 torch thread as each Ray worker
    has (``num_cpus_per_worker=1``): on CPU, bitwise equality needs the same thread
    count, since matmul reductions may split differently."""
    _, model, trials = setup
    out = tmp_path_factory.mktemp("single")
    with one_thread():
        res = score_methods(model, trials, methods=METHODS, max_new_tokens=MAX_NEW,
                            out_dir=out, progress=False)
    assert res["locos"].meta["n_accepted"] >= 3
    return res, out


@pytest.fixture(scope="module")
def pool(setup):
    ray = pytest.importorskip("ray")
    from locos_tl.runs.distributed import model_pool

    if ray.is_initialized():  # another module's cluster: start our own
        ray.shutdown()
    path, _, _ = setup
    p = model_pool(path, workers=2, load_kwargs={"device": "cpu"},
                   ray_init_kwargs={"num_cpus": 2})
    with p:
        assert ray.is_initialized()
        yield p
    assert not ray.is_initialized(), "the local cluster the run started was not shut down"


@contextlib.contextmanager
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _assert_same(ref, got):
    for m in METHODS:
        a, b = ref[m], got[m]
        assert a.trial_ids == b.trial_ids
        assert torch.equal(a.trial_scores, b.trial_scores), m
        assert (a.step_scores is None) == (b.step_scores is None)
        if a.step_scores is not None:
            assert torch.equal(a.step_scores, b.step_scores), m
        assert torch.equal(a.scores, b.scores)
        for k in ("n_trials", "n_accepted", "n_dropped_gate", "n_dropped_no_answer_step"):
            assert a.meta[k] == b.meta[k], k


def _lines(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / RECORDS_FILE).read_text().splitlines()]


def test_two_workers_equal_single_process(setup, reference, pool, tmp_path):
    path, model, trials = setup
    ref, ref_dir = reference
    seen = []
    # score_methods dispatches to Ray for an open pool; a loaded bridge is accepted
    got = score_methods(model, trials, methods=METHODS, max_new_tokens=MAX_NEW,
                        out_dir=tmp_path, progress=False, workers=pool,
                        on_record=lambda ev: seen.append(ev.worker))
    _assert_same(ref, got)
    assert len(seen) == len(trials)
    assert set(seen) == {0, 1}, "both workers took trials from the queue"
    # the same run directory as a single-process run: settings and one line a trial
    meta = json.loads((tmp_path / "meta.json").read_text())
    ref_meta = json.loads((ref_dir / "meta.json").read_text())
    assert meta["settings"] == ref_meta["settings"]
    assert sorted(r["trial_id"] for r in _lines(tmp_path)) == sorted(t.trial_id for t in trials)
    assert got["locos"].meta["distributed"]["workers"] == 2


def test_rerun_skips_finished_and_resumes_across_modes(setup, reference, pool, tmp_path,
                                                       monkeypatch):
    import locos_tl.experiments.score as score_mod

    path, model, trials = setup
    ref, _ = reference
    # a single-process run interrupted after 3 trials (a run directory holds one trial
    # set, so the interruption is simulated, not a run over a subset) ...
    real_run_trial = score_mod.run_trial

    def stop_after_3(*a, **k):
        if (tmp_path / RECORDS_FILE).exists() and len(_lines(tmp_path)) >= 3:
            raise KeyboardInterrupt
        return real_run_trial(*a, **k)

    monkeypatch.setattr(score_mod, "run_trial", stop_after_3)
    with one_thread(), pytest.raises(KeyboardInterrupt):
        score_methods(model, trials, methods=METHODS, max_new_tokens=MAX_NEW,
                      out_dir=tmp_path, progress=False)
    monkeypatch.setattr(score_mod, "run_trial", real_run_trial)
    assert len(_lines(tmp_path)) == 3
    ran = []
    got = score_methods(path, trials, methods=METHODS, max_new_tokens=MAX_NEW,
                        out_dir=tmp_path, progress=False, workers=pool,
                        on_record=lambda ev: ran.append(ev.result["trial_id"]))
    assert sorted(ran) == sorted(t.trial_id for t in trials[3:])  # ... is finished by Ray
    _assert_same(ref, got)
    ran.clear()
    reused: list[tuple[int, int]] = []
    again = score_methods(path, trials, methods=METHODS, max_new_tokens=MAX_NEW,
                          out_dir=tmp_path, progress=False, workers=pool,
                          on_record=lambda ev: ran.append(ev.result["trial_id"]),
                          on_resume=lambda *a: reused.append(a))
    assert ran == [], "a rerun skips finished trials"
    assert reused == [(len(trials), len(trials))], "and says so from the same rule"
    _assert_same(ref, again)
    assert len(_lines(tmp_path)) == len(trials)
    # and a single-process rerun reads the distributed records without decoding
    import locos_tl.experiments.score as score_mod

    def boom(*a, **k):
        raise AssertionError("decoded a finished trial")

    orig, score_mod.run_trial = score_mod.run_trial, boom
    try:
        single = score_methods(model, trials, methods=METHODS, max_new_tokens=MAX_NEW,
                               out_dir=tmp_path, progress=False)
    finally:
        score_mod.run_trial = orig
    _assert_same(ref, single)


def test_more_workers_than_the_cluster_holds_fails_clearly(pool):
    from locos_tl.runs.distributed import ModelLoader, RayPool

    with pytest.raises(DistributedError, match="3 workers x 1 CPU"):
        with RayPool(ModelLoader("unused"), workers=3):
            pass


def test_missing_model_dir_fails_before_starting_ray(setup, tmp_path):
    ray = pytest.importorskip("ray")
    from locos_tl.errors import ModelLoadError

    _, _, trials = setup
    was_up = ray.is_initialized()
    with pytest.raises(ModelLoadError, match="does not exist"):
        score_trials(str(tmp_path / "nope"), trials, workers=2, progress=False)
    assert ray.is_initialized() == was_up


def test_missing_ray_gives_install_hint(setup, monkeypatch):
    path, model, trials = setup
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(DistributedError, match=r'pip install "locos_tl\[ray\]"'):
        score_trials(model, trials, workers=2, progress=False)
    assert RAY_INSTALL_HINT == 'pip install "locos_tl[ray]"'


def test_cli_workers_without_ray_explains(setup, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from locos_tl.cli import app
    from locos_tl.trials import save_trials

    path, _, trials = setup
    f = save_trials(trials, tmp_path / "t.jsonl")
    monkeypatch.setitem(sys.modules, "ray", None)
    r = CliRunner().invoke(app, ["score", "--model", str(path), "--trials", str(f),
                                 "--out", str(tmp_path / "run"), "--workers", "2"])
    assert r.exit_code == 2
    assert 'pip install "locos_tl[ray]"' in r.output


def test_cli_workers_dispatch(setup, reference, tmp_path, monkeypatch):
    """``locos score --workers 2 --ray-address ADDR`` reaches score_methods as one
    ``RayWorkers``, passing the model path (no model is loaded in the driver)."""
    from typer.testing import CliRunner

    import locos_tl
    import locos_tl.experiments.score
    import locos_tl.models.load
    import locos_tl.runs.distributed
    from locos_tl.cli import app
    from locos_tl.trials import save_trials

    path, _, trials = setup
    ref, _ = reference
    f = save_trials(trials, tmp_path / "t.jsonl")
    calls = {}

    def fake_score(model, trials, **kw):
        calls.update(model=model, n=len(trials), **kw)
        return ref

    def no_load(*a, **k):
        raise AssertionError("the driver loaded the model")

    monkeypatch.setattr(locos_tl.experiments.score, "score_methods", fake_score)
    monkeypatch.setattr(locos_tl.models.load, "load_model", no_load)
    monkeypatch.setattr(locos_tl.runs.distributed, "require_ray", lambda: None)  # ray optional
    r = CliRunner().invoke(app, ["score", "--model", str(path), "--trials", str(f),
                                 "--out", str(tmp_path / "run"), "--method", "locos,wu,dla",
                                 "--workers", "2", "--ray-address", "auto"])
    assert r.exit_code == 0, r.output
    assert calls["model"] == str(path) and calls["n"] == len(trials)
    assert calls["workers"] == locos_tl.RayWorkers(2, address="auto",
                                                   load_kwargs={"dtype": "float32"})


def test_device_map_on_cpu_scores_like_plain_load(setup, reference):
    """``load_model(device_map=...)`` (placement passed to accelerate) scores exactly
    like a plain CPU load; the per-layer device gathering of ``DecodeStep.phi`` runs."""
    path, _, trials = setup
    ref, _ = reference
    trials = trials[:3]
    n_layers = int(ref["locos"].n_layers)
    per_module = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.norm": "cpu",
                  "lm_head": "cpu", **{f"model.layers.{i}": "cpu" for i in range(n_layers)}}
    for dm in ({"": "cpu"}, per_module):
        m = load_model(path, device_map=dm)
        got = score_methods(m, trials, methods=METHODS, max_new_tokens=MAX_NEW, progress=False)
        for k in METHODS:
            rows = [ref[k].trial_ids.index(t) for t in got[k].trial_ids]
            assert rows, "no accepted trial to compare"
            want = ref[k].trial_scores[rows]
            n = max(t.n_tokens for t in trials) + MAX_NEW
            assert_close_within(got[k].trial_scores, want,
                                model_tol(m, want, n_tokens=n, reads=4), k)


def test_ablation_sweep_on_two_workers_equals_single_process(setup, reference, pool,
                                                             tmp_path):
    """``ablation_sweep(..., workers=N)``: the ablated generations run on the workers; same
    table and the same resumable records as a single-process sweep."""
    import pandas as pd

    from locos_tl.experiments.evaluate import ablation_sweep

    _, model, trials = setup
    ref, _ = reference
    kw = dict(k=[1, 3], mode="query_zero", random=False, bottom=None,
              max_new_tokens=MAX_NEW, progress=False)
    with one_thread():
        single = ablation_sweep(model, trials[:3], {"locos": ref["locos"]}, out_dir=tmp_path / "a",
                          **kw)
    dist = ablation_sweep(model, trials[:3], {"locos": ref["locos"]}, out_dir=tmp_path / "b",
                    workers=pool, **kw)
    pd.testing.assert_frame_equal(single, dist)
    key = lambda r: r["trial_id"]  # noqa: E731
    assert sorted(_lines(tmp_path / "a"), key=key) == sorted(_lines(tmp_path / "b"), key=key)



def test_workers_record_the_name_margin_as_one_process_does(setup, reference, pool,
                                                            tmp_path):
    """On trials with distractor names the workers score the name margin from their own
    prefill: the same table (``name_margin`` included) and records as one process."""
    import dataclasses

    import pandas as pd

    from locos_tl.experiments.evaluate import ablation_sweep

    _, model, trials = setup
    ref, _ = reference
    names = [t.answer for t in trials[:3]]
    rivals = [dataclasses.replace(t, meta={**t.meta, "distractor_names": [names[i - 1]]})
              for i, t in enumerate(trials[:3])]
    kw = dict(k=[1, 3], mode="query_zero", random=False, bottom=None,
              max_new_tokens=MAX_NEW, progress=False)
    with one_thread():
        single = ablation_sweep(model, rivals, {"locos": ref["locos"]}, out_dir=tmp_path / "a",
                          **kw)
    dist = ablation_sweep(model, rivals, {"locos": ref["locos"]}, out_dir=tmp_path / "b",
                    workers=pool, **kw)
    assert (single.metric == "name_margin").sum() == 3  # baseline and k = 1, 3
    pd.testing.assert_frame_equal(single, dist)
    key = lambda r: r["trial_id"]  # noqa: E731
    a, b = sorted(_lines(tmp_path / "a"), key=key), sorted(_lines(tmp_path / "b"), key=key)
    assert a == b and all("name_margin" in r for r in b)


def test_continuations_must_be_one_entry_per_item():
    """A misaligned ``continuations`` list is refused before Ray starts."""
    from locos_tl.runs.distributed import generate_ablated_distributed

    with pytest.raises(ValueError, match="2 entries for 1 items"):
        generate_ablated_distributed("unused", [((), None)], mode="query_zero",
                                     continuations=[None, [[3]]])


def test_killed_worker_loses_only_its_trial(setup, reference, pool, tmp_path):
    """Kill worker 1 for good when the first record arrives (it is mid-trial or about
    to take one): its trial is retried on worker 0 and the result is still identical."""
    import ray

    path, model, trials = setup
    ref, _ = reference
    killed = []

    def kill_once(ev):
        if not killed:
            victim = 1 - ev.worker
            ray.kill(ev.pool.actors[victim], no_restart=True)
            killed.append(victim)

    got = score_methods(path, trials, methods=METHODS, max_new_tokens=MAX_NEW,
                        out_dir=tmp_path, progress=False, workers=pool, on_record=kill_once)
    _assert_same(ref, got)
    info = got["locos"].meta["distributed"]
    # the one call the dead worker had (in flight, or dispatched just after the kill)
    # failed and its trial ran again on worker 0; no trial was written twice
    assert len(info["retried_trials"]) == 1
    assert sorted(r["trial_id"] for r in _lines(tmp_path)) == sorted(t.trial_id for t in trials)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(pool.actors[killed[0]].ping.remote())
