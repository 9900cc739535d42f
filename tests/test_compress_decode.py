"""Compressed decoding (locos_tl.experiments.compress): the full budget reproduces plain greedy
decoding; partial budgets equal an independent brute-force reference (uncached bridge
forward with evicted keys masked per head at ``hook_attn_scores``); measured bytes;
budgets on sliding-window layers; models with learned attention sinks refused.

Logits are compared within :func:`tolerances.model_tol` (float32 summation order: the
kernels differ, the math does not). Measured, largest error / tolerance: full budget
6.9e-6 / 6.8e-4 (llama; 1.09e-5 on another machine, where a fixed 1e-5 failed),
partial budgets 1.4e-5 / 6.2e-4 (llama), the same under ``OMP_NUM_THREADS=1`` and the
default.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tolerances import assert_close_within, model_tol

from locos_tl import Trial
from locos_tl.engine.decode import greedy_decode
from locos_tl.errors import LocosError, TrialError
from locos_tl.experiments.compress import (
    compress_cache,
    compressed_generate,
    context_capacity,
    kv_budgets,
)
from locos_tl.experiments.compress.cache import layer_entries
from locos_tl.experiments.compress.generate import n_heads_of, prefill_context

N, QS, STEPS = 40, 36, 6


def _trial(model, seed=0, n=N, qs=QS):
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(1, int(model.cfg.d_vocab) - 1, (n,), generator=g).tolist()
    return Trial(tokens=toks, needle_span=(5, 9), answer="the", meta={"query_start": qs})


def _plain(model, trial):
    logits = []
    res = greedy_decode(model, list(trial.tokens), max_new_tokens=STEPS, stop_rule="none",
                        stop_at_eos=False, on_step=lambda s: logits.append(s.logits.float()))
    return res.generated, torch.stack(logits)


def _check_full(model):
    trial = _trial(model)
    L, H, n_kv = n_heads_of(model)
    b = kv_budgets(np.zeros((L, H)), 1.0, QS, n_kv, capacity=context_capacity(model, QS))
    res = compressed_generate(model, trial, b, max_new_tokens=STEPS, stop_at_eos=False,
                              stop_rule="newline_token", keep_logits=True)
    toks, logits = _plain(model, trial)
    assert res.tokens == toks
    assert_close_within(res.logits, logits, model_tol(model, logits, n_tokens=N + STEPS),
                        "compressed vs plain greedy logits")
    assert res.retained_entries == res.full_entries
    assert res.kv_bytes == res.full_kv_bytes


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "olmo2", "llama"])
def test_full_budget_reproduces_greedy_decode(tiny_models, arch):
    _check_full(tiny_models(arch))


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_full_budget_sliding_window_shorter_than_prompt(windowed, arch):
    model = windowed(arch)
    hf = model.original_model.config
    assert hf.sliding_window < QS and "sliding_attention" in hf.layer_types
    _check_full(model)


def _reference_logits(model, trial, generated, budgets, qs):
    """Uncached bridge forward of prompt + generated tokens; for query positions >= qs,
    context keys outside a head's retained set get -inf at ``hook_attn_scores``."""
    ids = torch.tensor([list(trial.tokens) + generated[:-1]])
    n = ids.shape[1]
    L, H, _ = n_heads_of(model)
    masks = []
    for l in range(L):
        m = torch.zeros(H, n, n, dtype=torch.bool)  # True = evicted
        for h in range(H):
            evicted = np.setdiff1d(np.arange(qs), budgets.head_positions(l, h))
            m[h, qs:, torch.as_tensor(evicted, dtype=torch.long)] = True
        masks.append(m)

    def hook(scores, hook):
        l = int(hook.name.split(".")[1])
        return scores.masked_fill(masks[l][None], float("-inf"))

    hooks = [(f"blocks.{l}.attn.hook_attn_scores", hook) for l in range(L)]
    with torch.no_grad():
        masked = model.run_with_hooks(ids, fwd_hooks=hooks, return_type="logits")[0]
        plain = model(ids, return_type="logits")[0]
    return masked[trial.n_tokens - 1 :].float(), plain[trial.n_tokens - 1 :].float()


def _check_partial(model, unit, fraction=0.45, seed=0, allocation="greedy", scores=None):
    trial = _trial(model, seed=seed)
    L, H, n_kv = n_heads_of(model)
    if scores is None:
        scores = np.random.default_rng(seed).random((L, H))
    b = kv_budgets(scores, fraction, QS, n_kv, unit=unit, allocation=allocation,
                   sinks=2, min_recent=3, capacity=context_capacity(model, QS))
    assert 0 < b.retained_fraction < 1 and not b.is_full().all()
    assert b.is_full().any() or allocation != "greedy"
    res = compressed_generate(model, trial, b, max_new_tokens=STEPS, stop_at_eos=False,
                              keep_logits=True)
    ref, plain = _reference_logits(model, trial, res.tokens, b, QS)
    tol = model_tol(model, ref, n_tokens=N + STEPS)
    assert_close_within(res.logits, ref, tol, "compressed vs masked reference logits")
    # the eviction matters: the unmasked forward differs far beyond rounding
    assert (plain - ref).abs().max() > 10 * tol
    assert res.kv_bytes < res.full_kv_bytes
    return b, res


@pytest.mark.parametrize("arch", ["qwen3", "olmo2", "llama"])
def test_partial_budget_equals_masked_reference(tiny_models, arch):
    _check_partial(tiny_models(arch), "kv_group")


@pytest.mark.parametrize("allocation", ["proportional", "uniform"])
def test_partial_budget_other_allocations(tiny_models, allocation):
    _check_partial(tiny_models("qwen3"), "kv_group", allocation=allocation, fraction=0.6)


def test_query_head_variant_equals_masked_reference(tiny_models):
    model = tiny_models("qwen3")
    b, res = _check_partial(model, "query_head", seed=1)
    # entries counted per query head; bytes are the per-group union
    L, H, n_kv = n_heads_of(model)
    G = H // n_kv
    assert res.retained_entries == b.retained_entries
    assert res.full_entries == L * H * QS
    union = sum(np.unique(np.concatenate([b.positions(l, h) for h in range(g * G, (g + 1) * G)]))
                .size for l in range(L) for g in range(n_kv))
    d_head = int(model.cfg.d_head)
    assert res.kv_bytes == union * 2 * d_head * 4


def test_sliding_layer_budgets_stay_in_the_window(windowed):
    model = windowed("gemma3")
    window = int(model.original_model.config.sliding_window)
    # every gemma layer here is sliding: the full cache holds window - 1 keys per group
    L, H, n_kv = n_heads_of(model)
    assert context_capacity(model, QS).tolist() == [window - 1] * L
    b, res = _check_partial(model, "kv_group", fraction=0.8)
    assert res.full_entries == b.full_entries == L * n_kv * (window - 1)
    assert res.retained_entries == b.retained_entries == round(0.8 * b.full_entries)
    for l in range(L):
        for g in range(n_kv):
            assert set(b.positions(l, g)) <= set(range(QS - window + 1, QS))
    assert res.kv_bytes == b.retained_entries * 2 * int(model.cfg.d_head) * 4


@pytest.fixture(scope="module")
def mixed_gemma(tmp_path_factory):
    """Tiny Gemma-3 with a sliding layer (window 8) then a full-attention layer."""
    from locos_tl import load_model
    from locos_tl.models.tiny import make_tiny_checkpoint

    path = make_tiny_checkpoint("gemma3", tmp_path_factory.mktemp("mixed") / "gemma3",
                                seed=3, sliding_window=8,
                                layer_types=["sliding_attention", "full_attention"])
    return load_model(path, device="cpu")


def test_sliding_budget_surplus_goes_to_the_next_heads(mixed_gemma):
    """A ranking that puts the sliding layer's heads first stores as many
    entries as one that puts the full layer's first (the budget), counted in the real
    compressed cache; retained_fraction is that count over the full cache's."""
    model = mixed_gemma
    L, H, n_kv = n_heads_of(model)
    qs = 40
    trial = _trial(model, n=44, qs=qs)
    full = prefill_context(model, trial, qs)
    stored_full = sum(layer.keys.shape[-2] * layer.keys.shape[1] for layer in full.layers)
    assert stored_full == n_kv * (7 + 40)  # the window keeps its last 7 context keys
    capacity = context_capacity(model, qs)
    assert capacity.tolist() == [7, 40]
    sliding_first = np.array([[1.0] * H, [0.0] * H])
    stored = {}
    for name, scores in (("sliding", sliding_first), ("full", sliding_first[::-1].copy())):
        b = kv_budgets(scores, 0.5, qs, n_kv, capacity=capacity)
        cache = compress_cache(full, b, H)
        n = sum(sum(groups) for groups in layer_entries(cache))
        assert n == cache.retained_entries == b.retained_entries
        assert cache.full_entries == b.full_entries == stored_full
        assert b.retained_fraction == n / stored_full
        stored[name] = n
    assert stored["sliding"] == stored["full"] == round(0.5 * stored_full)
    # budgets that ignore the window are refused, not silently shrunk
    blind = kv_budgets(sliding_first, 0.5, qs, n_kv)
    with pytest.raises(LocosError, match="capacity=context_capacity"):
        compressed_generate(model, trial, blind, max_new_tokens=1)


def test_mixed_window_partial_budget_equals_masked_reference(mixed_gemma):
    L, H, _ = n_heads_of(mixed_gemma)
    sliding_first = np.array([[1.0] * H, [0.0] * H])
    b, res = _check_partial(mixed_gemma, "kv_group", fraction=0.6, scores=sliding_first)
    assert b.is_full()[0].all() and not b.is_full()[1].all()


class _SinkAttention(torch.nn.Module):
    """The part of GPT-OSS's attention that matters here: a learned sink per head."""

    def __init__(self) -> None:
        super().__init__()
        self.sinks = torch.nn.Parameter(torch.zeros(4))
        self.layer_idx, self.head_dim = 0, 16


class _FakeSinkModel:
    def __init__(self) -> None:
        self.original_model = torch.nn.ModuleDict({"attn": _SinkAttention()})


def test_learned_sinks_are_refused():
    from locos_tl.experiments.compress.cache import compressed_attention, compression_twin

    with pytest.raises(LocosError, match=r"\(attn\.sinks\) has learned attention sinks"):
        compression_twin(_FakeSinkModel())
    # the attention itself refuses an s_aux argument, or a module holding sinks
    q = torch.zeros(1, 4, 1, 16)
    for module, kw in ((torch.nn.Module(), {"s_aux": torch.zeros(4)}), (_SinkAttention(), {})):
        with pytest.raises(LocosError, match="learned attention sinks"):
            compressed_attention(module, q, q, q, None, **kw)


def test_importing_the_cache_registers_no_attention_until_the_first_twin(tiny_models):
    """transformers' attention registry is global to the process: importing the module
    leaves it alone; the first compression twin registers, once."""
    import subprocess
    import sys

    probe = ("import locos_tl.experiments.compress as c, locos_tl.experiments.compress.cache"
             " as m; from transformers import AttentionInterface as A; "
             "print(m.ATTN_NAME in A(), m.ATTN_NAME in A._global_mapping)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]

    from transformers import AttentionInterface

    from locos_tl.experiments.compress.cache import (
        ATTN_NAME,
        compressed_attention,
        compression_twin,
        register_attention,
    )

    twin = compression_twin(tiny_models("llama"))
    assert twin.config._attn_implementation == ATTN_NAME
    assert AttentionInterface()[ATTN_NAME] is compressed_attention
    before = dict(AttentionInterface._global_mapping)
    register_attention()  # idempotent: the registry is unchanged
    assert AttentionInterface._global_mapping == before


def test_kv_bytes_measured_equal_entries(tiny_models):
    model = tiny_models("llama")
    L, H, n_kv = n_heads_of(model)
    trial = _trial(model)
    b = kv_budgets(np.random.default_rng(3).random((L, H)), 0.5, QS, n_kv)
    res = compressed_generate(model, trial, b, max_new_tokens=1)
    d_head = int(model.cfg.d_head)
    assert res.retained_entries == b.retained_entries
    assert res.kv_bytes == b.retained_entries * 2 * d_head * 4
    assert res.full_kv_bytes == L * n_kv * QS * 2 * d_head * 4
    assert res.kv_bytes < res.full_kv_bytes
    assert abs(res.retained_fraction - 0.5) <= 1 / res.full_entries


def test_errors(tiny_models):
    model = tiny_models("qwen3")
    L, H, n_kv = n_heads_of(model)
    t = _trial(model)
    no_qs = Trial(tokens=t.tokens, needle_span=(5, 9), answer="x")
    b = kv_budgets(np.zeros((L, H)), 1.0, QS, n_kv)
    with pytest.raises(TrialError, match="query_start"):
        compressed_generate(model, no_qs, b)
    with pytest.raises(TrialError, match="context of 36"):
        compressed_generate(model, t, b, query_start=30)
    wrong = kv_budgets(np.zeros((L + 1, H)), 1.0, QS, n_kv)
    with pytest.raises(TrialError, match="layers"):
        compressed_generate(model, t, wrong)
    for bad in (0, True):
        with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
            compressed_generate(model, t, b, max_new_tokens=bad)


def test_nan_logits_raise_in_compressed_decoding(tiny_models):
    from locos_tl.errors import NonFiniteError

    model = tiny_models("llama")
    L, H, n_kv = n_heads_of(model)
    t = _trial(model)
    b = kv_budgets(np.zeros((L, H)), 1.0, QS, n_kv)
    ok = compressed_generate(model, t, b, max_new_tokens=3, stop_at_eos=False)
    emb = model.original_model.get_input_embeddings().weight
    last = t.tokens[-1]  # fed with the question: step 0's logits turn NaN
    saved = emb.data[last].clone()
    emb.data[last] = float("nan")
    try:
        with pytest.raises(NonFiniteError, match=r"compressed decoding step 0: the logits "
                                                 r"hold NaN or inf \(dtype torch.float32"):
            compressed_generate(model, t, b, max_new_tokens=3)
    finally:
        emb.data[last] = saved
    assert compressed_generate(model, t, b, max_new_tokens=3, stop_at_eos=False).tokens \
        == ok.tokens


def test_refuses_hooks_on_the_bridge(tiny_models):
    from locos_tl.errors import LocosError

    model = tiny_models("qwen3")
    L, H, n_kv = n_heads_of(model)
    b = kv_budgets(np.zeros((L, H)), 1.0, QS, n_kv)
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", lambda z, hook: z * 0)]), \
            pytest.raises(LocosError, match="hooks"):
        compressed_generate(model, _trial(model), b)
