"""Sliding-window layers with windows SHORTER than the prompt.

Every architecture with sliding layers: Gemma-3 (layer 0 sliding) and Qwen3 with
``use_sliding_window`` (layer 1 sliding), window 8, prompts of 40 tokens. References are
independent of locos_tl's decoding: a separately loaded HF model with eager attention
and no KV cache (``output_attentions``; values from a hook on the layer's ``v_proj``;
``W_O`` from ``o_proj``; ``u`` from ``lm_head``).
"""

from __future__ import annotations

import re

import pytest
import torch
from tolerances import assert_close_within, model_tol

from locos_tl import Trial, phi_from_model
from locos_tl.engine.answers import answer_steps
from locos_tl.engine.decode import DecodeStep, greedy_decode
from locos_tl.engine.unembed import AnswerDirections

WINDOW = 8
N_PROMPT = 40
SLIDING = {"gemma3": 0, "qwen3": 1}  # the sliding layer of each checkpoint
OVERRIDES = {
    "gemma3": dict(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"]),
    "qwen3": dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
}


@pytest.fixture(scope="module")
def sliding(tmp_path_factory):
    """arch -> (bridge, independent HF eager model)."""
    from transformers import AutoModelForCausalLM

    from locos_tl import load_model
    from locos_tl.models.tiny import byte_bpe_tokenizer, make_tiny_checkpoint

    root = tmp_path_factory.mktemp("sliding")
    tok = byte_bpe_tokenizer()
    out = {}
    for arch, ov in OVERRIDES.items():
        d = make_tiny_checkpoint(arch, root / arch, seed=1, tokenizer=tok, **ov)
        hf = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager",
                                                  dtype=torch.float32).eval()
        assert hf.config.layer_types[SLIDING[arch]] == "sliding_attention"
        assert hf.config.sliding_window == WINDOW
        out[arch] = (load_model(d, device="cpu"), hf)
    return out


def _prompt(vocab: int, seed: int = 0, n: int = N_PROMPT) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab - 1, (n,), generator=g).tolist()


@torch.no_grad()
def _hf_last_query(hf, tokens):
    """HF eager, no cache: per layer the attention row of the last query ``[H, K]`` and
    the values ``[K, n_kv, d_head]``, plus the logits and hidden states."""
    cfg = hf.config
    vs: dict[int, torch.Tensor] = {}
    hooks = [layer.self_attn.v_proj.register_forward_hook(
        lambda m, i, o, li=li: vs.__setitem__(li, o)) for li, layer in enumerate(hf.model.layers)]
    try:
        out = hf(torch.tensor([tokens]), output_attentions=True, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    K = len(tokens)
    rows = [a[0, :, -1] for a in out.attentions]
    values = [vs[l][0].reshape(K, cfg.num_key_value_heads, cfg.head_dim)
              for l in range(cfg.num_hidden_layers)]
    return rows, values, out.logits[0, -1]


def _check_phi(model, pattern, phi, rows, ref, n_tokens):
    """Pattern rows (read off q.k: 2 sums) and phi (values, pattern, W_O u: 3) equal the
    HF eager reference to float32 summation order (tests/tolerances.py)."""
    rows = torch.stack(rows)
    assert_close_within(pattern, rows, model_tol(model, rows, n_tokens=n_tokens, reads=2),
                        "pattern")
    assert_close_within(phi, ref, model_tol(model, ref, n_tokens=n_tokens, reads=3), "phi")


@torch.no_grad()
def _W_O(hf, layer):
    """``[H, d_head, d_model]`` from ``o_proj``."""
    cfg = hf.config
    w = hf.model.layers[layer].self_attn.o_proj.weight  # [d_model, H * d_head]
    return w.T.reshape(cfg.num_attention_heads, cfg.head_dim, -1)


@torch.no_grad()
def _brute_phi(hf, rows, values, y):
    """Explicit loops of Eq. 2 with the raw unembedding column of ``y``."""
    cfg = hf.config
    H, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    u = hf.lm_head.weight[y]
    out = []
    for l, (a, v) in enumerate(zip(rows, values, strict=True)):
        W = _W_O(hf, l)
        phi = torch.zeros(H, a.shape[-1])
        for h in range(H):
            phi[h] = a[h] * ((v[:, h // (H // n_kv)] @ W[h]) @ u)
        out.append(phi)
    return torch.stack(out)


@pytest.mark.parametrize("arch", ["gemma3", "qwen3"])
def test_phi_matches_hf_eager_past_the_window(sliding, arch):
    model, hf = sliding[arch]
    tokens = _prompt(int(model.cfg.d_vocab))
    y = 17
    lay = SLIDING[arch]
    for q in (N_PROMPT - 1, 30):
        phi, pattern = phi_from_model(model, tokens, y, query_pos=q, return_pattern=True)
        rows, values, _ = _hf_last_query(hf, tokens[: q + 1])
        ref = _brute_phi(hf, rows, values, y)
        _check_phi(model, pattern, phi, rows, ref, q + 1)
        # the sliding layer attends to exactly the last WINDOW keys, the oldest included
        first = q + 1 - WINDOW
        assert pattern[lay, :, :first].abs().max().item() == 0.0
        assert pattern[lay, :, first].min().item() > 0.0
        assert ref[lay, :, first].abs().max().item() > 1e-2  # the key the bug zeroed
        assert phi.abs().max().item() > 1e-2


@pytest.mark.parametrize("arch", ["gemma3", "qwen3"])
@pytest.mark.parametrize("prefill_mode", ["sdpa", "bridge"])
def test_every_decode_step_matches_hf_eager(sliding, arch, prefill_mode):
    """Pattern rows, values and phi of later decoding steps (keys generated past the
    window), with the fast prefill and with the bridge prefill in chunks of 5."""
    model, hf = sliding[arch]
    tokens = _prompt(int(model.cfg.d_vocab), seed=3)
    steps: list[DecodeStep] = []
    res = greedy_decode(model, tokens, max_new_tokens=12, on_step=steps.append,
                        directions=AnswerDirections(model, "raw"), stop_rule="none",
                        stop_at_eos=False, prefill_mode=prefill_mode, chunk_size=5)
    assert len(steps) == 12
    for step in steps[::4] + steps[-1:]:
        keys = tokens + res.generated[: step.t]
        assert step.key_tokens.tolist() == keys
        rows, values, _ = _hf_last_query(hf, keys)
        ref = _brute_phi(hf, rows, values, step.token)
        _check_phi(model, step.pattern, step.phi, rows, ref, len(keys))
        lay = SLIDING[arch]
        first = len(keys) - WINDOW
        # values at absolute positions inside the window (zeros before it)
        assert_close_within(step.values[lay][first:], values[lay][first:],
                            model_tol(model, values[lay], n_tokens=len(keys), layers=lay),
                            "values")
        assert step.values[lay][:first].abs().max().item() == 0.0


@pytest.mark.parametrize("arch", ["gemma3", "qwen3"])
def test_exact_phi_sums_to_dla_past_the_window(sliding, arch):
    """``sum_j phi_exact = DLA`` per head; DLA from HF eager without cache: the head's
    slice of ``o_proj`` applied to its ``o_proj`` input, post-attention norm frozen,
    final-norm gain over its rms, dotted with ``lm_head[y]``."""
    model, hf = sliding[arch]
    tokens = _prompt(int(model.cfg.d_vocab), seed=5)
    y = 42
    phi = phi_from_model(model, tokens, y, variant="exact")
    cfg = hf.config
    H, d = cfg.num_attention_heads, cfg.head_dim
    z_in: dict[int, torch.Tensor] = {}
    post_in: dict[int, torch.Tensor] = {}
    final_in: list[torch.Tensor] = []
    hooks = []
    for li, layer in enumerate(hf.model.layers):
        hooks.append(layer.self_attn.o_proj.register_forward_pre_hook(
            lambda m, a, li=li: z_in.__setitem__(li, a[0][0, -1])))
        if hasattr(layer, "post_attention_layernorm") and arch == "gemma3":
            hooks.append(layer.post_attention_layernorm.register_forward_pre_hook(
                lambda m, a, li=li: post_in.__setitem__(li, a[0][0, -1])))
    hooks.append(hf.model.norm.register_forward_pre_hook(
        lambda m, a: final_in.append(a[0][0, -1])))
    try:
        with torch.no_grad():
            hf(torch.tensor([tokens]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    eps = cfg.rms_norm_eps
    offset = 1.0 if arch == "gemma3" else 0.0

    def inv_rms(x):
        return torch.rsqrt(x.pow(2).mean() + eps)

    u = hf.lm_head.weight[y] * (hf.model.norm.weight + offset) * inv_rms(final_in[0])
    dla = torch.zeros(cfg.num_hidden_layers, H)
    for l in range(cfg.num_hidden_layers):
        W = _W_O(hf, l)
        for h in range(H):
            write = z_in[l][h * d : (h + 1) * d] @ W[h]
            if l in post_in:
                gamma = hf.model.layers[l].post_attention_layernorm.weight + offset
                write = write * gamma * inv_rms(post_in[l])
            dla[l, h] = write @ u
    # one more sum, over positions: its partial sums are bounded by sum_j |phi_j|
    assert_close_within(phi.sum(-1), dla, model_tol(model, phi.abs().sum(-1),
                                                    n_tokens=len(tokens), reads=4),
                        "sum_j phi_exact vs DLA")
    assert dla[SLIDING[arch]].abs().max().item() > 1e-2


@pytest.mark.parametrize("arch", ["gemma3", "qwen3"])
def test_greedy_tokens_equal_hf_generate(sliding, arch):
    model, hf = sliding[arch]
    tokens = _prompt(int(model.cfg.d_vocab), seed=7)
    n = 20
    with torch.no_grad():
        ref = hf.generate(torch.tensor([tokens]), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=hf.config.pad_token_id)
    ref = ref[0, len(tokens):].tolist()
    for mode in ("sdpa", "bridge"):
        got = greedy_decode(model, tokens, max_new_tokens=n, stop_rule="none",
                            stop_at_eos=False, prefill_mode=mode, chunk_size=6)
        assert got.generated == ref, mode


def _own_answer_trials(model, n=2):
    """Trials whose gold answer is a word of the model's own greedy response (so they
    pass the gate on a random-init model), needle span [12, 16) (outside the sliding
    window of every step) and [34, 38) (inside it)."""
    out = []
    for seed in range(300):
        tokens = _prompt(int(model.cfg.d_vocab), seed=100 + seed)
        text = greedy_decode(model, tokens, max_new_tokens=8).text
        words = re.findall(r"[A-Za-z]{3,}", text)
        if words:
            span = (12, 16) if len(out) % 2 == 0 else (34, 38)
            out.append(Trial(tokens=tokens, needle_span=span, answer=words[0]))
        if len(out) == n:
            return out
    raise RuntimeError("no prompt with a word in its response")


def _contrast(x, span, n_keys):
    s, e = span
    n = e - s
    on = x[..., s:e].sum(-1)
    off = x.sum(-1) - on
    return on - n / (n_keys - n) * off


@pytest.mark.parametrize("arch", ["gemma3", "qwen3"])
def test_detectors_match_independent_values(sliding, arch):
    """``score_trials`` with all five detectors, one decode pass: LOCOS, attention-spatial
    and DLA per-trial scores against explicit formulas over HF eager rows/values; every
    detector's per-step value equals its value on a step built from HF eager tensors."""
    from locos_tl import score_methods
    from locos_tl.detectors import get_detector

    model, hf = sliding[arch]
    trials = _own_answer_trials(model)
    methods = ["locos", "wu", "headkv", "attention_spatial", "dla"]
    res = score_methods(model, trials, methods=methods, progress=False, max_new_tokens=8)
    directions = AnswerDirections(model, "raw")
    W_O = [_W_O(hf, l) for l in range(hf.config.num_hidden_layers)]
    for i, trial in enumerate(trials):
        decoded: list[DecodeStep] = []
        out = greedy_decode(model, trial.tokens, on_step=decoded.append,
                            directions=directions, max_new_tokens=8)
        steps = answer_steps(model.tokenizer, out.generated, trial.answer,
                             start=out.response_start)
        assert steps
        locos, spatial, dla, scale = [], [], [], []
        for step in decoded:
            keys = list(trial.tokens) + out.generated[: step.t]
            rows, values, logits = _hf_last_query(hf, keys)
            assert int(logits.argmax()) == step.token
            pattern = torch.stack(rows)
            phi = _brute_phi(hf, rows, values, step.token)
            # every detector sums phi or the pattern over positions
            scale.append(max(phi.abs().sum(-1).max(), pattern.sum(-1).max()))
            tol = model_tol(model, scale[-1], n_tokens=len(keys), reads=4)
            brute = DecodeStep(t=step.t, token=step.token, key_tokens=step.key_tokens,
                               pattern=pattern, values=values, scales={}, logits=logits,
                               _W_O=W_O, _directions=directions)
            for m in methods:
                d = get_detector(m)
                if d.steps == "prompt":
                    continue
                span = tuple(trial.span(d.span))
                a = d.step_value(step, span)
                b = d.step_value(brute, span)
                assert_close_within(a, b, tol, m)
            if step.t in steps:
                locos.append(_contrast(phi, trial.needle_span, len(keys)))
                spatial.append(_contrast(pattern, trial.needle_span, len(keys)))
                dla.append(phi.sum(-1))
        for name, ref in (("locos", locos), ("attention_spatial", spatial), ("dla", dla)):
            assert res[name].n_trials == len(trials)
            got = res[name].trial_scores[i].float()
            assert_close_within(got, torch.stack(ref).mean(0),
                                model_tol(model, max(scale), n_tokens=len(keys), reads=5),
                                name)


def _zero_head_hooks(hf, layer, head, mode):
    """HF hooks equivalent to ``query_zero`` (zero the head's slice of ``q_proj``'s
    output, before QK-norm and rotary) and ``output_zero`` (zero its slice of the
    ``o_proj`` input)."""
    d = hf.config.head_dim
    attn = hf.model.layers[layer].self_attn
    sl = slice(head * d, (head + 1) * d)
    if mode == "query_zero":
        def q_hook(m, i, o):
            o = o.clone()
            o[..., sl] = 0
            return o

        return [attn.q_proj.register_forward_hook(q_hook)]

    def o_hook(m, args):
        x = args[0].clone()
        x[..., sl] = 0
        return (x,)

    return [attn.o_proj.register_forward_pre_hook(o_hook)]


@pytest.mark.parametrize("arch", ["gemma3", "qwen3"])
@pytest.mark.parametrize("mode", ["query_zero", "output_zero"])
def test_ablated_greedy_equals_hf_with_equivalent_hook(sliding, arch, mode):
    from locos_tl import ablate

    model, hf = sliding[arch]
    tokens = _prompt(int(model.cfg.d_vocab), seed=11)
    n = 16
    head = (SLIDING[arch], 1)

    def hf_greedy():
        with torch.no_grad():
            out = hf.generate(torch.tensor([tokens]), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=hf.config.pad_token_id,
                              output_logits=True, return_dict_in_generate=True)
        return out.sequences[0, len(tokens):].tolist(), torch.stack(out.logits)[:, 0]

    hooks = _zero_head_hooks(hf, *head, mode)
    try:
        ref_ids, ref_logits = hf_greedy()
    finally:
        for h in hooks:
            h.remove()
    _, clean_logits = hf_greedy()
    assert (clean_logits[0] - ref_logits[0]).abs().max().item() > 1e-3  # it matters
    steps: list[DecodeStep] = []
    with ablate(model, [head], mode):
        got = greedy_decode(model, tokens, max_new_tokens=n, stop_rule="none",
                            stop_at_eos=False, prefill_mode="bridge", chunk_size=7,
                            on_step=steps.append)
    assert got.generated == ref_ids
    logits = torch.stack([s.logits for s in steps])
    assert_close_within(logits, ref_logits,
                        model_tol(model, ref_logits, n_tokens=len(tokens) + n), "logits")


@pytest.mark.parametrize("arch", ["gemma3", "qwen3"])
def test_cri_equals_uncached_hf_patching(sliding, arch):
    """CRI with 5-token query chunks over a window of 8 (the KV cache slides between
    chunks) equals activation patching on HF eager without any cache: the clean run's
    ``o_proj`` input slice of the head, patched at every position into the corrupted
    run; metric gold minus counterfactual logit at the last prompt position."""
    from locos_tl.experiments.patching import corrupt_tokens, cri_trial

    model, hf = sliding[arch]
    tokens = _prompt(int(model.cfg.d_vocab), seed=13)
    trial = Trial(tokens=tokens, needle_span=(14, 22), answer="the")
    rec = cri_trial(model, trial, answer_position="prompt_end", chunk_size=5)
    rec_full = cri_trial(model, trial, answer_position="prompt_end", chunk_size=1024,
                         share_prefix=False)
    assert rec["accepted"]
    cri = torch.tensor(rec["scores"]["cri"])
    with torch.no_grad():
        logits = model(torch.tensor([tokens]), return_type="logits")[0]
    # a metric is a difference of two logits, a CRI score of two metrics
    tol_metric = 2 * model_tol(model, logits, n_tokens=len(tokens))
    assert_close_within(cri, torch.tensor(rec_full["scores"]["cri"]), 2 * tol_metric,
                        "cri, 5-token chunks vs one")
    gold, cf = rec["gold"], rec["counterfactual"]
    corr = corrupt_tokens(model.tokenizer, trial)
    d = hf.config.head_dim

    def run(ids, layer=None, head=None, src=None, keep=None):
        hooks = []
        for li, lay in enumerate(hf.model.layers):
            def pre(m, args, li=li):
                if keep is not None:
                    keep[li] = args[0].clone()
                if li == layer:
                    x = args[0].clone()
                    x[..., head * d : (head + 1) * d] = src[li][..., head * d : (head + 1) * d]
                    return (x,)
                return None

            hooks.append(lay.self_attn.o_proj.register_forward_pre_hook(pre))
        try:
            with torch.no_grad():
                logits = hf(torch.tensor([ids]), use_cache=False).logits[0, -1]
        finally:
            for h in hooks:
                h.remove()
        return float(logits[gold] - logits[cf])

    z_clean: dict[int, torch.Tensor] = {}
    run(list(tokens), keep=z_clean)
    m_corr = run(corr)
    assert_close_within(rec["metric_corrupted"], m_corr, tol_metric, "metric_corrupted")
    lay = SLIDING[arch]
    for h in range(hf.config.num_attention_heads):
        ref = run(corr, layer=lay, head=h, src=z_clean) - m_corr
        assert_close_within(cri[lay, h].item(), ref, 2 * tol_metric, f"cri head {h}")
    assert cri[lay].abs().max().item() > 1e-3
