"""Greedy decoding through the bridge matches Hugging Face generation token for token.

Also the regression guard for the transformers 5.24 bug (TransformerLens 4.3's cached
decode steps saw only 1 key and produced different tokens): every decode-step attention
row must span all N_t keys and sum to 1.
"""

import pytest
import torch
from tolerances import assert_close_within, model_tol

from locos_tl.engine.decode import greedy_decode, prefill
from locos_tl.errors import TrialError


def _prompt(model, n=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, int(model.cfg.d_vocab) - 1, (n,), generator=g).tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3", "olmo2"])
@pytest.mark.parametrize("prefill_mode", ["sdpa", "bridge"])
def test_greedy_matches_hf_generate(tiny_models, arch, prefill_mode):
    model = tiny_models(arch)
    tokens = _prompt(model)
    steps = []
    res = greedy_decode(model, tokens, max_new_tokens=10, stop_at_newline=False,
                        stop_at_eos=False, prefill_mode=prefill_mode, chunk_size=8,
                        on_step=steps.append)
    hf = model.original_model
    ids = torch.tensor([tokens])
    for use_cache in (True, False):
        out = hf.generate(ids, max_new_tokens=10, do_sample=False, use_cache=use_cache,
                          eos_token_id=None, pad_token_id=0)
        assert res.generated == out[0, len(tokens):].tolist(), (arch, use_cache)
    for t, s in enumerate(steps):
        n_keys = len(tokens) + t
        assert s.pattern.shape == (model.cfg.n_layers, model.cfg.n_heads, n_keys)
        ones = torch.ones(model.cfg.n_layers, model.cfg.n_heads)
        torch.testing.assert_close(s.pattern.sum(-1), ones)
        assert all(v.shape[0] == n_keys for v in s.values)
        assert s.key_tokens.tolist() == tokens + res.generated[:t]


def test_chunked_prefill_equals_full_forward(qwen3):
    tokens = torch.tensor([_prompt(qwen3, 40, seed=3)])
    cache_sdpa = prefill(qwen3, tokens[:, :-1], mode="sdpa")
    cache_chunk = prefill(qwen3, tokens[:, :-1], mode="bridge", chunk_size=16)
    n = tokens.shape[1]
    for l, (a, b) in enumerate(zip(cache_sdpa.layers, cache_chunk.layers, strict=True)):
        assert_close_within(a.values, b.values, model_tol(qwen3, b.values, n_tokens=n,
                                                          layers=l), f"values L{l}")
        assert_close_within(a.keys, b.keys, model_tol(qwen3, b.keys, n_tokens=n, layers=l),
                            f"keys L{l}")
    with torch.no_grad():
        full = qwen3(tokens, return_type="logits")[0, -1]
        step = qwen3(tokens[:, -1:], past_key_values=cache_chunk, return_type="logits")[0, -1]
    assert_close_within(step, full, model_tol(qwen3, full, n_tokens=n), "cached step logits")
    with pytest.raises(ValueError, match="unknown prefill mode"):
        prefill(qwen3, tokens, mode="fast")


def test_stops_at_eos_and_newline(qwen3):
    tok = qwen3.tokenizer
    tokens = _prompt(qwen3)
    free = greedy_decode(qwen3, tokens, max_new_tokens=6, stop_at_newline=False, stop_at_eos=False)
    # force an EOS as the 3rd token: decoding must stop right after it
    forced = free.generated[:2] + [tok.eos_token_id] + free.generated[2:]
    res = greedy_decode(qwen3, tokens, max_new_tokens=6, forced_tokens=forced)
    assert res.generated == forced[:3] and res.stopped_by == "eos"
    nl = tok.encode("\n", add_special_tokens=False)[0]
    res = greedy_decode(qwen3, tokens, max_new_tokens=6, forced_tokens=[forced[0], nl, 5, 6])
    assert res.generated == [forced[0], nl] and res.stopped_by == "newline"
    assert "\n" not in res.text


def test_context_length_checked(qwen3):
    n_ctx = qwen3.cfg.n_ctx
    with pytest.raises(TrialError, match="n_ctx"):
        greedy_decode(qwen3, [1] * (n_ctx - 5), max_new_tokens=10)
    with pytest.raises(TrialError, match="empty prompt"):
        greedy_decode(qwen3, [], max_new_tokens=3)
