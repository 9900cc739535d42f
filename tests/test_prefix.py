"""Layer-prefix reuse (locos_tl.engine.prefix) equals recomputing the whole prompt.

An ablation at layer L leaves every layer below it as in the unablated run, so the
ablated prompt is computed from layer L on the kept ``resid_pre`` and the kept cache of
the layers below. Checked against the full prefill under the same ablation on 4-layer
Llama, Qwen3, Gemma-3 (sliding windows of 8, shorter than the 40-token prompt) and
OLMo-2 (shared query norm): every layer's cached keys and values, the greedy tokens,
every step's logits and the teacher-forced continuation log-probabilities. The two
paths run the same kernels on the same inputs for every layer they compute, so they
agree bit for bit (``torch.equal``); the kept prefix is never written to.
"""

from __future__ import annotations

import pytest
import torch

from locos_tl import Trial
from locos_tl.engine.ablation import ablate, calibrate_means
from locos_tl.engine.decode import greedy_decode
from locos_tl.engine.forward import prefill
from locos_tl.engine.prefix import (
    capture_prefix,
    prefill_from,
    prompt_prefix,
    trace_step,
)
from locos_tl.engine.twin import sdpa_twin
from locos_tl.models.tiny import SHORT_WINDOWS

PROMPT = torch.randint(1, 380, (1, 40), generator=torch.Generator().manual_seed(11))
# lowest layers 1, 2, 3 and one set with a layer-0 head (never reused)
HEAD_SETS = {"from1": [(1, 2), (3, 0)], "from2": [(2, 1), (2, 3)], "from3": [(3, 3)],
             "from0": [(0, 1), (2, 0)]}


@pytest.fixture(scope="module")
def deep(deep_windowed):
    """``get(arch)``: ``(bridge, means)`` of a 4-layer tiny checkpoint with short windows."""
    cache: dict[str, tuple] = {}

    def get(arch: str):
        if arch not in cache:
            model = deep_windowed(arch)
            means = calibrate_means(model, [PROMPT[0, :30].tolist(), list(range(7, 50))])
            cache[arch] = (model, means)
        return cache[arch]

    return get


def _kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]


def _q_proj_calls(model) -> tuple[list[int], list]:
    """Per layer, how many times the twin's ``q_proj`` ran (it runs only in layers that
    are computed, not replayed)."""
    calls = [0] * int(model.cfg.n_layers)
    handles = []
    for name, mod in sdpa_twin(model).named_modules():
        if name.endswith("self_attn.q_proj"):
            layer = int(name.split("layers.")[1].split(".")[0])

            def count(*_, layer=layer):
                calls[layer] += 1

            handles.append(mod.register_forward_pre_hook(count))
    return calls, handles


@pytest.mark.parametrize("mode", ["query_mean", "output_zero"])
@pytest.mark.parametrize("arch", list(SHORT_WINDOWS))
def test_prefill_from_the_lowest_ablated_layer_equals_the_full_prefill(deep, arch, mode):
    model, means = deep(arch)
    tokens = PROMPT[:, :-1]
    prefix = capture_prefix(model, tokens, [1, 2, 3])
    assert sorted(prefix.resid) == [1, 2, 3]
    kept = _kv(prefix.cache)
    for name, heads in HEAD_SETS.items():
        with ablate(model, heads, mode, means=means):
            full = prefill(model, tokens)
            calls, handles = _q_proj_calls(model)
            try:
                reused = prefill_from(model, prefix, tokens)
            finally:
                for h in handles:
                    h.remove()
        start = min(h[0] for h in heads)
        if start == 0:  # nothing below the ablation to reuse
            assert reused is None, name
            continue
        assert calls == [0] * start + [1] * (4 - start), (name, calls)  # layers >= start only
        for l, ((kf, vf), (kr, vr)) in enumerate(zip(_kv(full), _kv(reused), strict=True)):
            assert torch.equal(kf, kr) and torch.equal(vf, vr), (name, l)
            assert reused.layers[l].get_seq_length() == full.layers[l].get_seq_length()
    for (k0, v0), (k1, v1) in zip(kept, _kv(prefix.cache), strict=True):  # never written
        assert torch.equal(k0, k1) and torch.equal(v0, v1)


@pytest.mark.parametrize("arch", list(SHORT_WINDOWS))
def test_decoding_on_a_prefix_equals_decoding_from_scratch(deep, arch):
    model, means = deep(arch)
    prompt = PROMPT[0].tolist()
    prefix = prompt_prefix(model, prompt, list(HEAD_SETS.values()))
    conts = [[5, 9, 11], [17], [200, 3]]
    for name, heads in {**HEAD_SETS, "none": []}.items():
        runs = []
        for pre in (None, prefix):
            steps: list[torch.Tensor] = []
            with ablate(model, heads, "query_mean", means=means):
                res = greedy_decode(model, prompt, max_new_tokens=6, stop_rule="none",
                                    stop_at_eos=False, score_continuations=conts,
                                    on_step=lambda s, out=steps: out.append(s.logits.clone()),
                                    prefix=pre)
            runs.append((res.generated, torch.stack(steps), res.continuation_logprobs))
        (g0, l0, c0), (g1, l1, c1) = runs
        assert g0 == g1, name
        assert torch.equal(l0, l1), name
        assert c0 == c1, name


def test_prefix_falls_back_to_the_full_prefill_where_reuse_is_not_exact(deep):
    model, means = deep("qwen3")
    tokens = PROMPT[:, :-1]
    prefix = capture_prefix(model, tokens, [1, 3], max_bytes=int(tokens.shape[1]) * 64 * 4)
    assert list(prefix.resid) == [3] and prefix.skipped == [1]  # the highest layer first
    with ablate(model, [(1, 0)], "query_mean", means=means):
        assert prefill_from(model, prefix, tokens) is None  # resid_pre of layer 1 not kept
    with ablate(model, [(3, 0)], "query_mean", means=means):
        assert prefill_from(model, prefix, PROMPT[:, 1:]) is None  # other tokens
        assert prefill_from(model, prefix, tokens) is not None

        def noop(x, hook):
            return None

        with model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", noop)]):
            assert prefill_from(model, prefix, tokens) is None  # a user's hook: bridge
            with pytest.raises(ValueError, match="unablated"):
                capture_prefix(model, tokens, [3])


@pytest.mark.parametrize("arch", ["llama", "olmo2"])
def test_decode_steps_on_the_trace_equal_the_full_steps(deep, arch):
    """Each step fed the unablated decoding's tokens, computed from the lowest ablated
    layer on the trace, gives the full step's logits and leaves the same cache, bit for
    bit; a layer-0 head set is never reused."""
    model, means = deep(arch)
    twin = sdpa_twin(model)
    prefix = prompt_prefix(model, PROMPT[0].tolist(), list(HEAD_SETS.values()),
                           decode_steps=6)
    tr = prefix.trace
    assert tr is not None and len(tr.tokens) == 6 and sorted(tr.resid) == [1, 2, 3]
    for name, heads in {**HEAD_SETS, "none": []}.items():
        with ablate(model, heads, "query_mean", means=means):
            full = prefill(model, PROMPT[:, :-1])
            reused = prefill_from(model, prefix, PROMPT[:, :-1])
            x = PROMPT[:, -1:]
            for t in range(6):
                a = trace_step(model, prefix, reused, t, x)
                b = twin(x, past_key_values=full, use_cache=True, logits_to_keep=1)
                if name == "from0":
                    assert a is None
                    break
                assert torch.equal(a, b.logits[0, -1]), (name, t)
                x = torch.tensor([[tr.tokens[t]]])
            else:
                assert all(
                    torch.equal(k0, k1) and torch.equal(v0, v1)
                    for (k0, v0), (k1, v1) in zip(_kv(reused), _kv(full), strict=True))


@pytest.mark.parametrize("arch", list(SHORT_WINDOWS))
def test_decoding_on_a_trace_equals_decoding_from_scratch(deep, arch):
    """greedy_decode with a traced prefix: the same tokens under every head set, those
    that leave the unablated tokens and those that do not; steps that follow the
    unablated tokens run only the layers from the lowest ablated one. Sliding-window
    models keep no trace (their caches trim as they slide)."""
    model, means = deep(arch)
    prompt = PROMPT[0].tolist()
    prefix = prompt_prefix(model, prompt, list(HEAD_SETS.values()), decode_steps=8)
    if arch in ("gemma3", "qwen3"):
        assert prefix.trace is None
        return
    kw = dict(max_new_tokens=8, stop_rule="none", stop_at_eos=False)
    left = 0
    for name, heads in {**HEAD_SETS, "none": []}.items():
        with ablate(model, heads, "query_mean", means=means):
            calls, handles = _q_proj_calls(model)
            try:
                traced = greedy_decode(model, prompt, prefix=prefix, **kw)
            finally:
                for h in handles:
                    h.remove()
            plain = greedy_decode(model, prompt, **kw)
        assert traced.generated == plain.generated, name
        same = 0
        while same < 8 and traced.generated[same] == prefix.trace.tokens[same]:
            same += 1
        left += same < 8
        if name in ("from2", "from3"):  # prompt and the followed steps skip layers < L
            start = int(name[-1])
            reused_steps = min(same + 1, 8)
            assert calls[0] == 8 - reused_steps, (name, calls)
            assert calls[start] == 1 + 8, (name, calls)
        if name == "none":
            assert same == 8 and calls == [0] * 4  # the trace's own steps
    assert left >= 1  # some head set leaves the unablated tokens (the divergence path)


def test_a_trace_ends_where_the_unablated_decoding_stops(deep):
    """With the decodings' stop rules the trace is the unablated generation; a decoding
    that outruns a shorter trace goes on with full steps, the same tokens."""
    from locos_tl.engine.stops import stop_predicate

    model, means = deep("olmo2")
    prompt = PROMPT[0].tolist()
    sets = list(HEAD_SETS.values())
    ruled = prompt_prefix(model, prompt, sets, decode_steps=8,
                          stop=stop_predicate(model, prompt))
    with ablate(model, [], "query_mean", means=means):
        assert ruled.trace.tokens == greedy_decode(model, prompt, max_new_tokens=8).generated
    short = prompt_prefix(model, prompt, sets, decode_steps=8, stop=lambda t, y: t == 2)
    assert len(short.trace.tokens) == 3
    kw = dict(max_new_tokens=8, stop_rule="none", stop_at_eos=False)
    for heads in [[], *sets]:
        with ablate(model, heads, "query_mean", means=means):
            assert (greedy_decode(model, prompt, prefix=short, **kw).generated
                    == greedy_decode(model, prompt, **kw).generated)


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_ablation_sweep_reuse_switch_gives_identical_records(deep, tmp_path, arch):
    from locos_tl import ablation_sweep

    model, means = deep(arch)
    trials = [Trial(tokens=PROMPT[0, i:].tolist(), needle_span=(3, 6), answer="x",
                    trial_id=f"t{i}") for i in range(2)]
    import json

    import pandas as pd

    tables, records = [], []
    for reuse in (True, False):
        out = tmp_path / str(reuse)
        tables.append(ablation_sweep(model, trials, {"m": [(3, 1), (2, 0), (1, 2), (0, 3)]},
                                     k=[1, 2, 3], seeds=[0], means=means, max_new_tokens=5,
                                     scorer=lambda r, t: {"len": float(len(r))},
                                     progress=False, reuse_prefix=reuse, out_dir=out))
        recs = [json.loads(x) for x in (out / "trials.jsonl").read_text().splitlines()]
        records.append({r["trial_id"]: r["generated"] for r in recs})
        assert json.loads((out / "meta.json").read_text())["settings"]["reuse_prefix"] is reuse
    assert len(records[0]) >= 2 * 5 and records[0] == records[1]
    pd.testing.assert_frame_equal(tables[0], tables[1])


def _cri_trial_of(model) -> Trial:
    """A trial whose needle starts after a shared prefix and ends well before the end,
    so the patched runs cover the needle and the question."""
    tok = model.tokenizer
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    pre = enc("The river ran past the old mill and the quiet town square. " * 2)
    needle = enc(" Yuki lives next to the Semper Opera House.")
    post = enc(" Who? A:")  # near enough for Gemma-3's 8-token windows to reach the needle
    return Trial(tokens=pre + needle + post, needle_span=(len(pre), len(pre) + len(needle)),
                 answer="Yuki")


@pytest.mark.parametrize("arch", list(SHORT_WINDOWS))
def test_patching_from_the_patched_layer_equals_running_every_layer(deep, arch):
    """CRI with each patched forward started at the patched head's layer (on the
    corrupted run's kept ``resid_pre``) equals CRI with every layer run: bit for bit one
    head a forward (the same kernels on the same inputs), within float noise when heads
    of several layers share a batched forward (batch-size-dependent kernels)."""
    from locos_tl.experiments.patching import cri_trial

    model, _ = deep(arch)
    trial = _cri_trial_of(model)
    kw = dict(answer_position="prompt_end", corruption="filler")
    calls, handles = _q_proj_calls(model)
    try:
        reused = cri_trial(model, trial, batch_size=1, **kw)
    finally:
        for h in handles:
            h.remove()
    full = cri_trial(model, trial, batch_size=1, reuse_prefix=False, **kw)
    H = int(model.cfg.n_heads)
    # clean, the answer's first token, corrupted: every layer; then layer l runs for the
    # heads of layers <= l only
    assert calls == [3 + H * (l + 1) for l in range(4)], calls
    assert reused["scores"]["cri"] == full["scores"]["cri"]
    assert reused["metric_corrupted"] == full["metric_corrupted"]
    assert torch.tensor(full["scores"]["cri"]).abs().max() > 0  # patching did something
    batched = cri_trial(model, trial, batch_size=3, **kw)
    torch.testing.assert_close(torch.tensor(batched["scores"]["cri"]),
                               torch.tensor(full["scores"]["cri"]), rtol=1e-4, atol=1e-4)
