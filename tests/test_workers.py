"""``workers=``: the one argument that says where a run executes (no Ray needed here)."""

from __future__ import annotations

import pytest

import locos_tl as lt
from locos_tl.runs.distributed.pool import RayPool
from locos_tl.runs.distributed.workers import executor_options, legacy_workers


def test_a_count_and_ray_workers_become_the_distributed_runners_options():
    assert executor_options(1) is None  # this process
    assert executor_options(3) == {"workers": 3}
    w = lt.RayWorkers(4, address="auto", load_kwargs={"dtype": "bfloat16"},
                      num_gpus_per_worker=0.5, ray_init_kwargs={"log_to_driver": True})
    assert executor_options(w) == {
        "workers": 4, "ray_address": "auto", "load_kwargs": {"dtype": "bfloat16"},
        "num_gpus_per_worker": 0.5, "ray_init_kwargs": {"log_to_driver": True}}
    # unset options are left to the pool's defaults
    assert executor_options(lt.RayWorkers(2)) == {"workers": 2, "ray_address": None}


@pytest.mark.parametrize("bad, error, match", [
    (0, ValueError, "workers must be >= 1"),
    (2.0, TypeError, "workers must be an int, RayWorkers"),
    (True, TypeError, "workers must be an int, RayWorkers"),
    ("2", TypeError, "got str"),
])
def test_anything_else_is_refused(bad, error, match):
    with pytest.raises(error, match=match):
        executor_options(bad)


def test_ray_workers_needs_at_least_one_worker():
    with pytest.raises(ValueError, match=r"RayWorkers\(n=\.\.\.\) must be an int >= 1"):
        lt.RayWorkers(0)


def test_the_old_ray_keywords_become_workers_with_a_deprecation_warning():
    pool = object.__new__(RayPool)  # an open pool stands in; nothing starts
    with pytest.warns(DeprecationWarning, match=r"load_kwargs=, ray_address= deprecated.*"
                                                r"workers=RayWorkers\("):
        w = legacy_workers(3, {"ray_address": "auto", "load_kwargs": {"dtype": "float32"},
                               "num_gpus_per_worker": None}, "score_trials")
    assert w == lt.RayWorkers(3, address="auto", load_kwargs={"dtype": "float32"})
    with pytest.warns(DeprecationWarning):
        assert legacy_workers(1, {"pool": pool}, "score_methods") is pool
    assert legacy_workers(2, {}, "x") == 2  # nothing old: nothing changes
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="given beside"):
        legacy_workers(lt.RayWorkers(2), {"ray_address": "auto"}, "score_trials")
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="pool= holds"):
        legacy_workers(1, {"pool": pool, "max_attempts": 2}, "score_trials")


@pytest.mark.parametrize("fn", ["score_trials", "score_methods"])
def test_the_old_ray_keywords_still_reach_the_runner(fn, monkeypatch):
    """The old spelling runs the same executor the new one names (captured, not run)."""
    import locos_tl.experiments.score as sc

    seen = []

    def capture(workers):
        seen.append(workers)
        raise KeyboardInterrupt  # stop before any model is touched

    monkeypatch.setattr(sc, "executor_options", capture)
    trials = [lt.Trial(tokens=[1, 2, 3, 4], needle_span=(1, 2), answer="x")]
    with pytest.warns(DeprecationWarning, match="ray_address= deprecated"), \
            pytest.raises(KeyboardInterrupt):
        getattr(lt, fn)(None, trials, workers=2, ray_address="auto", max_attempts=3)
    assert seen == [lt.RayWorkers(2, address="auto", max_attempts=3)]


def test_a_misspelt_keyword_names_its_near_miss():
    trials = [lt.Trial(tokens=[1, 2, 3, 4], needle_span=(1, 2), answer="x")]
    with pytest.raises(TypeError, match=r"did you mean num_gpus_per_worker.*RayWorkers\("):
        lt.score_trials(None, trials, num_gpu_per_worker=1)
    with pytest.raises(TypeError, match=r"did you mean max_new_tokens for max_new_token"):
        lt.score_methods(None, trials, max_new_token=3)
    with pytest.raises(TypeError, match=r"ablation_sweep\(\) got unknown keyword\(s\) "
                                        r"\['max_new_token'\]; did you mean max_new_tokens"):
        lt.ablation_sweep(None, trials, {"x": [(0, 0)]}, max_new_token=3)

