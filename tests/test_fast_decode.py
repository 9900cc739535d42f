"""The lean decode step equals the bridge's ``hook_pattern`` path.

Scoring decode steps run on the eager twin (the bridge's tensors, ``output_attentions``)
by default; the TransformerBridge with ``hook_pattern`` hooks is the reference. On Qwen3
(a sliding layer), Gemma-3 (window 8, shorter than the 40-token prompt), OLMo-2 and
Llama in float32: attention rows, values, phi (raw and ``exact``, norm scales from the
twin's module hooks) and every method's per-trial score of ``score_trials`` equal to
float32 summation order (``tests/tolerances.py``), tokens identical. A step makes
exactly one host read.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch
from tolerances import assert_close_within, model_tol

from locos_tl import Trial
from locos_tl.detectors import DETECTORS, get_detector
from locos_tl.engine.decode import DecodeStep, greedy_decode
from locos_tl.engine.forward import engine_paths, step_engine
from locos_tl.engine.unembed import AnswerDirections
from locos_tl.experiments.score import score_methods, score_trials
from locos_tl.models.tiny import SHORT_WINDOWS

N_PROMPT = 40


def _prompt(model, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, int(model.cfg.d_vocab) - 1, (N_PROMPT,), generator=g).tolist()


def _steps(model, tokens, engine, variant):
    steps: list[DecodeStep] = []
    res = greedy_decode(model, tokens, max_new_tokens=12, on_step=steps.append,
                        directions=AnswerDirections(model, variant), stop_rule="none",
                        stop_at_eos=False, decode_engine=engine)
    return res, steps


@pytest.mark.parametrize("variant", ["raw", "exact"])
@pytest.mark.parametrize("arch", list(SHORT_WINDOWS))
def test_twin_steps_equal_bridge_hook_pattern(windowed, arch, variant):
    model = windowed(arch)
    assert step_engine(model, "auto").path == "eager_twin"
    tokens = _prompt(model, seed=11)
    fast, f_steps = _steps(model, tokens, "twin", variant)
    ref, r_steps = _steps(model, tokens, "bridge", variant)
    assert fast.generated == ref.generated and len(f_steps) == 12
    sliding = 0
    for a, b in zip(f_steps, r_steps, strict=True):
        assert a.token == b.token and a.key_tokens.tolist() == b.key_tokens.tolist()
        n = len(b.key_tokens)
        # the pattern is read off q.k (2 sums), phi off the values, the pattern and W_O u
        assert_close_within(a.pattern, b.pattern, model_tol(model, b.pattern, n_tokens=n,
                                                            reads=2), "pattern")
        assert_close_within(a.logits, b.logits, model_tol(model, b.logits, n_tokens=n),
                            "logits")
        for l, (va, vb) in enumerate(zip(a.values, b.values, strict=True)):
            assert_close_within(va, vb, model_tol(model, vb, n_tokens=n, layers=l),
                                f"values L{l}")
        assert set(a.scales) == set(b.scales)
        for k in a.scales:  # exact: the twin's norm scales equal hook_scale
            assert_close_within(a.scales[k], b.scales[k],
                                model_tol(model, b.scales[k], n_tokens=n), k)
        assert_close_within(a.phi, b.phi, model_tol(model, b.phi, n_tokens=n, reads=3),
                            "phi")
        assert a.phi.abs().max().item() > 1e-3  # not trivially zero
        sliding += int((a.pattern[:, :, 0] == 0).all(-1).any())  # a layer's window
    if variant == "exact":
        assert f_steps[0].scales  # the variant really reads norm scales
        if arch == "gemma3":  # post-attention norms: per-layer directions
            names = set(f_steps[0].scales)
            assert any("ln1_post" in n for n in names)
    if arch in ("qwen3", "gemma3"):  # a window shorter than the keys: zeros before it
        assert sliding == len(f_steps)


def _own_answer_trials(model, n=2):
    out = []
    for seed in range(300):
        tokens = _prompt(model, 500 + seed)
        words = re.findall(r"[A-Za-z]{3,}", greedy_decode(model, tokens, max_new_tokens=8).text)
        if words:
            span = (12, 16) if len(out) % 2 == 0 else (30, 36)
            out.append(Trial(tokens=tokens, needle_span=span, answer=words[0],
                             trial_id=f"t{seed}"))
        if len(out) == n:
            return out
    raise RuntimeError("no prompt with a word in its response")


@pytest.mark.parametrize("arch", list(SHORT_WINDOWS))
def test_score_trials_twin_equals_bridge(windowed, arch, tmp_path):
    model = windowed(arch)
    trials = _own_answer_trials(model)
    methods = list(DETECTORS)
    kw = dict(methods=methods, progress=False, max_new_tokens=8, variant="exact")
    fast = score_methods(model, trials, decode_engine="twin", out_dir=tmp_path / "f", **kw)
    ref = score_methods(model, trials, decode_engine="bridge", out_dir=tmp_path / "b", **kw)
    accepted = 0
    for m in methods:
        assert fast[m].n_trials == ref[m].n_trials
        accepted += fast[m].n_trials
        a, b = fast[m].trial_scores.float(), ref[m].trial_scores.float()
        assert a.shape == b.shape
        assert_close_within(a, b, model_tol(model, b, n_tokens=N_PROMPT + 8, reads=3), m,
                            equal_nan=True)
    assert accepted >= len(methods)  # scores were really compared
    # which paths ran is recorded in HeadScores.meta and meta.json
    assert fast["locos"].meta["engine"]["decode"] == "eager_twin"
    assert fast["locos"].meta["engine"]["prefill"] == "sdpa_twin"
    assert ref["locos"].meta["engine"]["decode"] == "bridge"
    assert "decode_engine='bridge'" in ref["locos"].meta["engine"]["decode_reason"]
    on_disk = json.loads((tmp_path / "f" / "meta.json").read_text())
    assert on_disk["engine"]["decode"] == "eager_twin"


def test_user_hook_routes_steps_through_the_bridge(windowed):
    model = windowed("llama")
    seen = []

    def user_hook(x, hook):
        seen.append(hook.name)

    tokens = _prompt(model, 3)
    plain, p_steps = _steps(model, tokens, "auto", "raw")
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", user_hook)]):
        with pytest.warns(RuntimeWarning, match="hook is attached"):
            eng = step_engine(model, "auto")
        assert eng.path == "bridge"
        with pytest.raises(ValueError, match="twin"):
            step_engine(model, "twin")
        paths = engine_paths(model)
        assert paths["decode"] == "bridge" and paths["prefill"] == "bridge"
        seen.clear()
        with pytest.warns(RuntimeWarning):
            res, steps = _steps(model, tokens, "auto", "raw")
    assert len(seen) >= len(steps) + 1  # it fired at the prefill and at every step
    assert res.generated == plain.generated
    with pytest.raises(ValueError, match="decode_engine"):
        step_engine(model, "fast")


def test_one_host_read_per_step(windowed):
    """``int()`` of the token is the step's only device-to-host read, with every
    detector's step value and phi computed on the device."""
    from torch.profiler import ProfilerActivity, profile

    model = windowed("gemma3")
    tokens = _prompt(model, 5)
    dets = [get_detector(m) for m in DETECTORS]
    trial = Trial(tokens=tokens, needle_span=(30, 36), answer="x")
    vals = []

    def on_step(step):
        vals.append(step.phi.sum())
        for d in dets:
            vals.append(d.step_value(step, trial.span(d.span)))

    n = 6
    greedy_decode(model, tokens, max_new_tokens=1, on_step=on_step,  # warm-up
                  directions=AnswerDirections(model, "exact"))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        greedy_decode(model, tokens, max_new_tokens=n, on_step=on_step, stop_at_eos=False,
                      stop_rule="none", directions=AnswerDirections(model, "exact"))
    reads = sum(1 for e in prof.events() if e.name == "aten::_local_scalar_dense")
    assert reads == n


def test_unknown_keyword_is_a_type_error(windowed):
    model = windowed("llama")
    trial = Trial(tokens=_prompt(model, 1), needle_span=(3, 6), answer="x")
    with pytest.raises(TypeError, match=r"num_gpu_per_worker.*num_gpus_per_worker.*RayWorkers"):
        score_trials(model, [trial], num_gpu_per_worker=1)


def _imports(path: Path) -> set[str]:
    mods = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            mods.add(node.module)
            mods.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
    return mods


def test_data_flows_one_way():
    """runner <- local executor, runner <- Ray executor; neither executor imports the
    other or score.py, and the runner imports no executor."""
    pkg = Path(__file__).resolve().parents[1] / "locos_tl" / "runs"
    runner, local = (_imports(pkg / f) for f in ("runner.py", "local.py"))
    dist = set().union(*(_imports(f) for f in (pkg / "distributed").glob("*.py")))
    executors = {"locos_tl.experiments.score", "locos_tl.runs.local", "locos_tl.runs.distributed"}
    assert not runner & executors
    assert not local & {"locos_tl.experiments.score", "locos_tl.runs.distributed"}
    assert not dist & {"locos_tl.experiments.score", "locos_tl.runs.local"}
    assert "locos_tl.runs.runner" in dist or "locos_tl.runs.runner.run_trial" in dist
    assert "locos_tl.runs.runner" in local
