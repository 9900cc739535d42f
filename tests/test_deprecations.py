"""Every deprecated name and keyword of the public API warns at the caller's line.

Python's default filters show a ``DeprecationWarning`` only when it is attributed to
``__main__``: a warning attributed to a frame inside locos_tl (``score_trials(...,
ray_address=...)`` used to name ``score.py``) is never seen. Each case checks that the
warning's file is this test file. Paths deprecated before the first release are
removed, not kept: they raise as any unknown name or keyword does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest

import locos_tl as lt
from locos_tl.runs.distributed.pool import RayPool
from locos_tl.runs.distributed.workers import LEGACY_RAY_OPTIONS


class _Stop(Exception):
    """Raised where the run would start: the warnings are given by then."""


def _stop(*_a, **_k):
    raise _Stop


@pytest.fixture
def no_run(monkeypatch):
    """The executors' option check stops every call before a model is touched."""
    import locos_tl.experiments.score as sc

    monkeypatch.setattr(sc, "executor_options", _stop)


TRIALS = [lt.Trial(tokens=[1, 2, 3, 4], needle_span=(1, 2), answer="x")]


def _deprecations(call) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(_Stop):
            call()
    return [w for w in caught if issubclass(w.category, DeprecationWarning)]


def _legacy_value(option: str):
    if option == "pool":
        return object.__new__(RayPool)  # an open pool stands in; nothing starts
    return {"ray_address": "auto", "load_kwargs": {"dtype": "float32"},
            "num_gpus_per_worker": 0.5, "num_cpus_per_worker": 1.0, "max_restarts": 1,
            "max_attempts": 2, "ray_init_kwargs": {"log_to_driver": False}}[option]


def test_the_list_of_old_ray_keywords_is_the_one_tested():
    assert set(LEGACY_RAY_OPTIONS) == {
        "ray_address", "load_kwargs", "num_gpus_per_worker", "num_cpus_per_worker",
        "max_restarts", "max_attempts", "ray_init_kwargs", "pool"}


@pytest.mark.parametrize("option", LEGACY_RAY_OPTIONS)
@pytest.mark.parametrize("fn", ["score_trials", "score_methods"])
def test_an_old_ray_keyword_warns_at_the_callers_line(no_run, fn, option):
    kw = {option: _legacy_value(option)}
    got = _deprecations(lambda: getattr(lt, fn)(None, TRIALS, **kw))
    assert [str(w.message).split(":")[0] for w in got] == [f"{fn}()"]
    assert f"{option}= deprecated" in str(got[0].message)
    assert got[0].filename == __file__


def test_score_trials_methods_warns_at_the_callers_line(no_run):
    got = _deprecations(lambda: lt.score_trials(None, TRIALS, methods=["locos"]))
    assert len(got) == 1 and "score_trials(methods=[...]) is deprecated" in str(got[0].message)
    assert got[0].filename == __file__
    # with an old Ray keyword too: both warnings, both at this line
    got = _deprecations(lambda: lt.score_trials(None, TRIALS, methods=["locos"],
                                                ray_address="auto", workers=2))
    assert len(got) == 2 and {w.filename for w in got} == {__file__}


def test_paths_removed_before_the_first_release_are_refused():
    """``locos_tl.evaluate``, ``stop_at_newline=`` and ``ablation_sweep``'s Ray keywords
    are gone (no warning, no alias): each fails before any model is touched."""
    import locos_tl.engine.stops as stops

    with pytest.raises(AttributeError, match="no attribute 'evaluate'"):
        lt.evaluate  # noqa: B018
    assert not hasattr(stops, "legacy_stop_rule")
    sweep = [None, TRIALS, {"x": [(0, 0)]}]
    for kw in ({"stop_at_newline": False}, {"ray_address": "auto"}, {"max_attempts": 2}):
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            with pytest.raises(TypeError, match=rf"(unexpected keyword argument |unknown "
                                                rf"keyword\(s\) \[)'{[*kw][0]}'"):
                lt.ablation_sweep(*sweep, **kw)
    with pytest.raises(TypeError, match=r"greedy_decode\(\) got unknown keyword\(s\) "
                                        r"\['stop_at_newline'\]"):
        lt.greedy_decode(None, [1, 2, 3], stop_at_newline=False)


#: names that moved, and the module they were still importable from: each is imported
#: from its own module now
MOVED = [
    ("locos_tl.engine.decode", "prefill", "locos_tl.engine.forward"),
    ("locos_tl.engine.decode", "engine_paths", "locos_tl.engine.forward"),
    ("locos_tl.engine.decode", "check_stop_rule", "locos_tl.engine.stops"),
    ("locos_tl.engine.decode", "is_newline_stop", "locos_tl.engine.stops"),
    ("locos_tl.experiments.evaluate", "build_jobs", "locos_tl.experiments.ablation_plan"),
    ("locos_tl.experiments.evaluate", "BASELINE", "locos_tl.experiments.dissociation"),
    ("locos_tl.experiments.evaluate", "summarize", "locos_tl.experiments.dissociation"),
    ("locos_tl.trials", "span_from_offsets", "locos_tl.trial_tokenizer"),
    ("locos_tl.runs.runner", "trial_record", "locos_tl.runs.trial"),
    ("locos_tl.data.prompt", "_nearest", "locos_tl.data.placement"),
]


@pytest.mark.parametrize(("old", "name", "home"), MOVED)
def test_a_moved_name_is_importable_from_its_home_only(old, name, home):
    import importlib

    assert hasattr(importlib.import_module(home), name)
    assert not hasattr(importlib.import_module(old), name), f"{old}.{name}: an old path"


def test_a_script_sees_the_deprecation_warnings_under_the_default_filters(tmp_path):
    """The symptom itself: ``python script.py`` (no filter set, no type-checking hook)
    prints each warning; before, ``score_trials(..., ray_address=...)`` printed
    nothing."""
    script = tmp_path / "old_user.py"
    script.write_text(textwrap.dedent("""
        import locos_tl as lt
        import locos_tl.experiments.score as sc

        def stop(*a, **k):
            raise KeyboardInterrupt

        sc.executor_options = stop
        trials = [lt.Trial(tokens=[1, 2, 3, 4], needle_span=(1, 2), answer="x")]
        calls = [
            lambda: lt.score_trials(None, trials, ray_address="auto", workers=2),
            lambda: lt.score_trials(None, trials, methods=["locos"]),
            lambda: lt.score_methods(None, trials, load_kwargs={}, workers=2),
        ]
        for call in calls:
            try:
                call()
            except KeyboardInterrupt:
                pass
    """))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=240, cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    shown = [line for line in res.stderr.splitlines() if "DeprecationWarning" in line]
    assert len(shown) == 3, res.stderr
    assert all(line.startswith(f"{script}:") for line in shown)
    assert "score_trials(): ray_address= deprecated" in shown[0]
