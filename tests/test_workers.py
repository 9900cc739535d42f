"""``workers=``: the one argument that says where a run executes (no Ray needed here)."""

from __future__ import annotations

import pytest

import locos_tl as lt
from locos_tl.runs.distributed.workers import executor_options


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


def test_the_old_ray_keywords_are_refused_with_the_new_spelling():
    trials = [lt.Trial(tokens=[1, 2, 3, 4], needle_span=(1, 2), answer="x")]
    for fn in (lt.score_trials, lt.score_methods):
        with pytest.raises(TypeError, match=r"\['load_kwargs', 'ray_address'\] \("
                                            r"load_kwargs, ray_address: Ray options go in "
                                            r"one argument, workers=RayWorkers\("):
            fn(None, trials, ray_address="auto", load_kwargs={})
    with pytest.raises(TypeError, match="unexpected keyword argument 'ray_address'"):
        lt.ablation_sweep(None, trials, {"x": [(0, 0)]}, ray_address="auto")
