"""Sweeps under hooks the caller attached first (an outer ``ablate()``, a steering hook).

The unablated prefix that ``reuse_prefix`` keeps is the prompt with no hook at all, so
under outer hooks the sweeps turn reuse off, with exactly one warning, and record what
``reuse_prefix=False`` records under the same hooks (before, they stopped with a
``ValueError`` about ``capture_prefix``). With no outer hook, reuse (prompt prefix and
decode-step trace) is used as before.
"""

from __future__ import annotations

import json
import warnings
from contextlib import contextmanager

import pytest
import torch

from locos_tl import Trial, ablate, ablation_sweep, teacher_forced_sweep
from locos_tl.engine import prefix as prefix_mod
from locos_tl.engine.interventions import lens_hooks_attached

PROMPT = torch.randint(1, 380, (1, 40), generator=torch.Generator().manual_seed(7)).tolist()[0]
RANKING = {"m": [(3, 1), (2, 0), (1, 2)]}
GRID = dict(k=[1, 2], seeds=[0], mode="query_zero", progress=False)
OUTER = "hooks are already attached"


def _trials() -> list[Trial]:
    meta = {"character": "Yuki", "distractor_names": ["Stuart", "Katie"]}
    return [Trial(tokens=PROMPT[i:], needle_span=(3, 6), answer="Yuki", meta=meta,
                  trial_id=f"t{i}") for i in range(2)]


@contextmanager
def _outer(model, kind: str):
    """An outer ablation, a steering hook through ``model.hooks``, or one through
    ``add_hook`` (removed on exit)."""
    if kind == "ablate":
        with ablate(model, [(0, 1)], "query_zero"):
            yield
        return
    v = torch.randn(int(model.cfg.d_model), generator=torch.Generator().manual_seed(0))

    def steer(x, hook):
        return x + 0.5 * v.to(x.dtype)

    if kind == "hooks":
        with model.hooks(fwd_hooks=[("blocks.1.hook_resid_pre", steer)]):
            yield
        return
    model.add_hook("blocks.1.hook_resid_pre", steer)
    try:
        yield
    finally:
        model.reset_hooks()


def _run(fn, model, out, **kw):
    """The sweep's table, its records by id, and the warnings about outer hooks."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        extra = (dict(max_new_tokens=5, scorer=lambda r, t: {"len": float(len(r))})
                 if fn is ablation_sweep else {})
        table = fn(model, _trials(), RANKING, out_dir=out, **GRID, **extra, **kw)
    recs = {r["trial_id"]: r for r in map(json.loads,
                                           (out / "trials.jsonl").read_text().splitlines())}
    return table, recs, [w for w in caught if OUTER in str(w.message)]


@pytest.fixture
def spy(monkeypatch):
    """Counts the prefixes captured and the decode traces run (through to the real ones)."""
    seen = {"capture": 0, "trace": 0}

    def counted(name):
        real = getattr(prefix_mod, name)

        def wrapper(*a, **k):
            seen[name.split("_")[0]] += 1
            return real(*a, **k)

        return wrapper

    monkeypatch.setattr(prefix_mod, "capture_prefix", counted("capture_prefix"))
    monkeypatch.setattr(prefix_mod, "trace_decode", counted("trace_decode"))
    return seen


@pytest.mark.parametrize("fn", [ablation_sweep, teacher_forced_sweep],
                         ids=["ablation_sweep", "teacher_forced_sweep"])
@pytest.mark.parametrize("kind", ["ablate", "hooks", "add_hook"])
def test_a_sweep_under_outer_hooks_records_what_no_reuse_records(deep_windowed, tmp_path,
                                                                 spy, fn, kind):
    model = deep_windowed("llama")  # no sliding window: the decode trace is used too
    plain, _, _ = _run(fn, model, tmp_path / "plain")
    assert spy["capture"] == 2  # one prefix a trial, with no outer hook
    assert spy["trace"] == (2 if fn is ablation_sweep else 0)
    spy.update(capture=0, trace=0)
    with _outer(model, kind):
        table, recs, warned = _run(fn, model, tmp_path / "default")
        off, recs_off, warned_off = _run(fn, model, tmp_path / "off", reuse_prefix=False)
    assert not lens_hooks_attached(model)
    assert spy == {"capture": 0, "trace": 0}  # nothing kept under the outer hooks
    assert len(warned) == 1 and not warned_off
    msg = str(warned[0].message)
    assert msg.startswith(f"{fn.__name__}(): ") and "reuse_prefix=False" in msg
    assert warned[0].category is UserWarning and warned[0].filename == __file__
    # the same records, bit for bit, as recomputing everything under the same hooks
    fields = ("logp_answer", "name_margin", "logp_target", "logp_best_distractor",
            "best_distractor", "trial_id", "heads_key", "trial", "n_heads", "response",
            "generated", "stopped_by")
    assert recs == recs_off and len(recs) == 5 * 2  # baseline, m and random at k 1, 2
    assert {k for r in recs.values() for k in r} <= set(fields)
    assert table.equals(off)
    meta = json.loads((tmp_path / "default" / "meta.json").read_text())
    assert meta["settings"]["reuse_prefix"] is False  # what ran
    # and the outer hooks were in effect: the margins differ from the run without them
    margins = table[table.metric == "name_margin"]["value"].to_numpy()
    base = plain[plain.metric == "name_margin"]["value"].to_numpy()
    assert len(margins) == len(base) == 5 and (abs(margins - base) > 1e-4).all()


def test_without_outer_hooks_reuse_is_kept_and_silent(deep_windowed, tmp_path, spy):
    model = deep_windowed("llama")
    for fn in (ablation_sweep, teacher_forced_sweep):
        _, recs, warned = _run(fn, model, tmp_path / fn.__name__)
        assert not warned
        meta = json.loads((tmp_path / fn.__name__ / "meta.json").read_text())
        assert meta["settings"]["reuse_prefix"] is True
    assert spy == {"capture": 4, "trace": 2}
