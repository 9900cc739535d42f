"""Ablation and activation patching run on the fast SDPA twin, equal to the bridge's hooks.

The TransformerLens hook path on the bridge is the reference; the twin
runs the same hook functions as module hooks (``q_proj`` output, OLMo's shared
``q_norm``, ``o_proj`` input). In float32 on Qwen3 (a sliding layer), Gemma-3 (window 8,
shorter than the 40-token prompt), OLMo-2 (shared query norm) and Llama: ablated logits
at every position, ablated greedy tokens and step logits, and CRI records equal the
bridge path to float32 summation order (``tests/tolerances.py``: on Llama the
*unablated* twin already differs from the bridge by 1.2e-5 on logits of magnitude 10).
A hook the twin cannot run (a user's) routes through the bridge.
"""

from __future__ import annotations

import pytest
import torch
from tolerances import assert_close_within, model_tol

from locos_tl import Trial
from locos_tl.engine.ablation import ABLATION_MODES, ablate, calibrate_means
from locos_tl.engine.decode import greedy_decode
from locos_tl.engine.forward import prefill
from locos_tl.engine.interventions import engine, hooks_reproducible, intervene
from locos_tl.engine.twin import sdpa_twin
from locos_tl.experiments.patching import cri_trial
from locos_tl.models.tiny import SHORT_WINDOWS

HEADS = [(0, 1), (1, 0), (1, 3)]  # two heads in layer 1 (both kv groups), one in layer 0
PROMPT = torch.randint(1, 380, (1, 40), generator=torch.Generator().manual_seed(5))


@pytest.fixture(scope="module")
def with_means(windowed):
    """``(bridge, calibration means)`` of the shared ``windowed`` float32 checkpoint."""
    cache: dict[str, tuple] = {}

    def get(arch: str):
        if arch not in cache:
            model = windowed(arch)
            means = calibrate_means(model, [PROMPT[0, :30].tolist(), list(range(7, 50))])
            cache[arch] = (model, means)
        return cache[arch]

    return get


class _Calls:
    """Counts forwards of the twin (a torch hook on the twin, not on the bridge)."""

    def __init__(self, model):
        self.n = 0
        self.handle = sdpa_twin(model).register_forward_pre_hook(self._count)

    def _count(self, *_):
        self.n += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def _noop(x, hook):  # a user's hook: changes nothing, but the twin cannot run it
    return None


def _twin_hooks(model) -> set[tuple[str, int]]:
    """The torch hooks on the twin's modules (transformers keeps its own there too)."""
    return {(name, k) for name, m in sdpa_twin(model).named_modules()
            for k in (*m._forward_hooks, *m._forward_pre_hooks)}


@pytest.mark.parametrize("mode", ABLATION_MODES)
@pytest.mark.parametrize("arch", list(SHORT_WINDOWS))
def test_ablated_forward_on_twin_equals_bridge(with_means, arch, mode):
    model, means = with_means(arch)
    twin = sdpa_twin(model)
    with torch.no_grad():
        clean = twin(PROMPT).logits[0]
        before = _twin_hooks(model)
        with ablate(model, HEADS, mode, means=means):
            assert _twin_hooks(model) > before
            assert engine(model) == "twin"
            fast = twin(PROMPT).logits[0]  # [pos, vocab]: every position
            ref = model(PROMPT, return_type="logits")[0]
    tol = model_tol(model, ref, n_tokens=PROMPT.shape[1])
    assert_close_within(fast, ref, tol, "ablated logits, twin vs bridge")
    assert (fast - clean).abs().max() > 10 * tol  # the ablation acts on the twin
    assert _twin_hooks(model) == before and hooks_reproducible(model)


@pytest.mark.parametrize("mode", ABLATION_MODES)
@pytest.mark.parametrize("arch", list(SHORT_WINDOWS))
def test_ablated_greedy_decode_on_twin_equals_bridge(with_means, arch, mode):
    model, means = with_means(arch)
    kw = dict(max_new_tokens=6, stop_rule="none", stop_at_eos=False)
    runs = {}
    for prefill_mode in ("auto", "bridge"):  # steps with a callback: through the bridge
        logits = []
        with ablate(model, HEADS, mode, means=means), _Calls(model) as calls:
            res = greedy_decode(model, PROMPT[0].tolist(), prefill_mode=prefill_mode,
                                on_step=lambda s, out=logits: out.append(s.logits), **kw)
        assert calls.n == (1 if prefill_mode == "auto" else 0)  # the prefill
        runs[prefill_mode] = (res.generated, torch.stack(logits))
    assert runs["auto"][0] == runs["bridge"][0]
    assert_close_within(runs["auto"][1], runs["bridge"][1],
                        model_tol(model, runs["bridge"][1], n_tokens=PROMPT.shape[1] + 6),
                        "ablated step logits")
    # no callback: prefill and every step on the SDPA twin, with the module hooks
    with ablate(model, HEADS, mode, means=means), _Calls(model) as calls:
        fast = greedy_decode(model, PROMPT[0].tolist(), **kw)
        ref = greedy_decode(model, PROMPT[0].tolist(), prefill_mode="bridge",
                            decode_engine="bridge", **kw)
    assert calls.n == 1 + kw["max_new_tokens"]
    assert fast.generated == ref.generated == runs["bridge"][0]
    plain = []
    greedy_decode(model, PROMPT[0].tolist(), max_new_tokens=1, prefill_mode="bridge",
                  decode_engine="bridge", on_step=lambda s: plain.append(s.logits))
    assert (runs["auto"][1][0] - plain[0]).abs().max() > 1e-2  # step 1 is ablated


@pytest.mark.parametrize("arch", list(SHORT_WINDOWS))
def test_patched_cri_on_twin_equals_bridge(with_means, arch):
    model, _ = with_means(arch)
    before = _twin_hooks(model)
    # the needle within reach of the last position through Gemma's 8-token windows
    trial = Trial(tokens=PROMPT[0].tolist(), needle_span=(24, 30), answer="Yuki")
    kw = dict(answer_position="prompt_end", batch_size=3, chunk_size=8)
    with _Calls(model) as calls:
        fast = cri_trial(model, trial, **kw)
    # in 8-query chunks: the shared prefix (3 chunks), then clean, corrupted and
    # ceil(8 heads / 3) patched runs over the 16 positions after it (2 chunks each)
    assert fast["shared_prefix"] == 24 and calls.n == 3 + 2 * (2 + 3)
    with model.hooks(fwd_hooks=[("hook_embed", _noop)]), _Calls(model) as calls:
        assert engine(model) == "bridge"
        ref = cri_trial(model, trial, **kw)
    assert calls.n == 0
    assert fast["accepted"] and ref["accepted"] and fast["gold"] == ref["gold"]
    assert fast["counterfactual"] == ref["counterfactual"]
    # metrics and CRI scores are differences of two logits: twice a logit's tolerance
    with torch.no_grad():
        logits = model(PROMPT, return_type="logits")[0]
    tol = 2 * model_tol(model, logits, n_tokens=PROMPT.shape[1])
    for key in ("metric_clean", "metric_corrupted"):
        assert_close_within(fast[key], ref[key], tol, key)
    a = torch.tensor(fast["scores"]["cri"])
    b = torch.tensor(ref["scores"]["cri"])
    assert_close_within(a, b, tol, "cri")
    assert a.abs().max() > 10 * tol  # patching moves the metric
    assert _twin_hooks(model) == before


def test_user_hook_forces_the_bridge_and_still_fires(with_means):
    model, means = with_means("qwen3")
    ids = PROMPT[:, :-1]
    calls: list[str] = []

    def user(x, hook):  # the user's own intervention: zero head 2's output at layer 0
        calls.append(hook.name)
        x = x.clone()
        x[:, :, 2] = 0.0
        return x

    with ablate(model, HEADS, "query_mean", means=means):
        with _Calls(model) as n:
            base = prefill(model, ids)  # on the twin
        assert n.n == 1
        with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", user)]):
            assert engine(model) == "bridge" and not hooks_reproducible(model)
            with _Calls(model) as n:
                got = prefill(model, ids)  # auto -> bridge, the user's hook fires
            assert n.n == 0 and calls
            ref = prefill(model, ids, mode="bridge", chunk_size=7)
        assert engine(model) == "twin"
    # layer 1's cache sees the user's change of layer 0; auto equals the bridge path
    tol = model_tol(model, ref.layers[1].keys, n_tokens=ids.shape[1], layers=1)
    assert_close_within(got.layers[1].keys, ref.layers[1].keys, tol, "layer 1 keys")
    assert (got.layers[1].keys - base.layers[1].keys).abs().max() > 10 * tol


def test_hook_without_twin_equivalent_warns_and_uses_the_bridge(with_means):
    model, _ = with_means("llama")
    with pytest.warns(RuntimeWarning, match="no module-hook equivalent"):
        with intervene(model, [("blocks.0.hook_resid_pre", _noop)]) as eng:
            assert eng == "bridge" == engine(model)
    assert engine(model) == "twin"


def test_hooks_removed_on_exception(with_means):
    model, means = with_means("olmo2")
    with torch.no_grad():
        sdpa_twin(model)(PROMPT[:, :4])  # transformers installs its own hooks on first use
    before = _twin_hooks(model)
    with pytest.raises(RuntimeError, match="boom"):
        with ablate(model, HEADS, "query_mean", means=means):
            added = {name for name, _ in _twin_hooks(model) - before}
            assert added == {f"model.layers.{l}.self_attn.q_norm" for l in (0, 1)}
            raise RuntimeError("boom")
    assert _twin_hooks(model) == before
    assert not any(hp.fwd_hooks for hp in model.hook_points())
    assert engine(model) == "twin"


@pytest.mark.parametrize("arch", list(SHORT_WINDOWS))
def test_calibration_means_on_twin_equal_bridge(with_means, arch):
    model, _ = with_means(arch)
    prompts = [PROMPT[0].tolist(), list(range(3, 30))]
    with _Calls(model) as calls:
        fast = calibrate_means(model, prompts, chunk_size=16)
    assert calls.n == 3 + 2  # 40 and 27 tokens in 16-query chunks
    with model.hooks(fwd_hooks=[("hook_embed", _noop)]), _Calls(model) as calls:
        ref = calibrate_means(model, prompts, chunk_size=16)
    assert calls.n == 0
    # means over prompts of every layer's hook_q (one read, W_Q) and hook_z (two)
    assert_close_within(fast.q, ref.q, model_tol(model, ref.q, n_tokens=40), "mean q")
    assert_close_within(fast.z, ref.z, model_tol(model, ref.z, n_tokens=40, reads=2),
                        "mean z")
    assert fast.z.abs().max() > 1e-2 and fast.q.abs().max() > 1e-2
