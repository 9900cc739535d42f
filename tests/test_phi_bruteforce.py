"""phi_from_model against independent computations from TransformerLens's cache."""

import pytest
import torch
from tolerances import assert_close_within, model_tol

from locos_tl import phi_from_model


def _cache(model, tokens):
    ids = torch.tensor([tokens])
    names = lambda n: n.endswith(("hook_pattern", "hook_v", "hook_z", "hook_scale"))  # noqa: E731
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names_filter=names)
    return cache


def _brute_phi(model, cache, q, y, direction_for_layer):
    """Explicit loops: alpha[l,h,q,j] * (v[l,j,g(h)] @ W_O[l,h]) . u_l."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    n_kv = model.cfg.n_key_value_heads
    out = torch.zeros(L, H, q + 1)
    for l in range(L):
        alpha = cache[f"blocks.{l}.attn.hook_pattern"][0, :, q, : q + 1]
        v = cache[f"blocks.{l}.attn.hook_v"][0]
        W_O = model.blocks[l].attn.W_O
        u = direction_for_layer(l)
        for h in range(H):
            g = h // (H // n_kv)
            for j in range(q + 1):
                out[l, h, j] = alpha[h, j] * ((v[j, g] @ W_O[h]) @ u)
    return out


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "olmo2"])
def test_raw_phi_matches_brute_force(tiny_models, arch):
    model = tiny_models(arch)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, int(model.cfg.d_vocab) - 1, (23,), generator=g).tolist()
    y = 17
    for q in (22, 15):  # last position and an inner query position
        phi = phi_from_model(model, tokens, y, query_pos=q)
        cache = _cache(model, tokens[: q + 1])
        ref = _brute_phi(model, cache, q, y, lambda l: model.W_U[:, y])
        assert phi.shape == (model.cfg.n_layers, model.cfg.n_heads, q + 1)
        # phi: values, pattern-weighted, then W_O u (3 sums after the layers)
        tol = model_tol(model, ref, n_tokens=q + 1, reads=3)
        assert_close_within(phi, ref, tol, "phi vs loops")
        assert phi.abs().max().item() > 10 * tol  # not trivially zero: the bound is meaningful


@pytest.mark.parametrize("arch", ["gemma3", "olmo2", "qwen3"])
def test_exact_phi_sums_to_direct_logit_attribution(tiny_models, arch):
    """Independent DLA: hook_z @ W_O, post-attention norm (offset + gamma)/scale,
    final norm gain / ln_final.hook_scale, dotted with W_U[:, y]."""
    model = tiny_models(arch)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, int(model.cfg.d_vocab) - 1, (19,), generator=g).tolist()
    y = 42
    phi = phi_from_model(model, tokens, y, variant="exact")
    cache = _cache(model, tokens)
    offset = 1.0 if getattr(model.cfg, "rmsnorm_uses_offset", False) else 0.0
    gain_final = model.ln_final.original_component.weight + offset
    u = model.W_U[:, y] * gain_final / cache["ln_final.hook_scale"][0, -1, 0]
    dla = torch.zeros(model.cfg.n_layers, model.cfg.n_heads)
    for l in range(model.cfg.n_layers):
        z = cache[f"blocks.{l}.attn.hook_z"][0, -1]  # [H, d_head]
        result = torch.einsum("hd,hdm->hm", z, model.blocks[l].attn.W_O)
        block = model.blocks[l]
        if hasattr(block, "ln1_post"):
            gamma = block.ln1_post.original_component.weight + offset
            result = result * gamma / cache[f"blocks.{l}.ln1_post.hook_scale"][0, -1, 0]
        dla[l] = result @ u
    # one more sum, over positions: its partial sums are bounded by sum_j |phi_j|
    tol = model_tol(model, phi.abs().sum(-1), n_tokens=len(tokens), reads=4)
    assert_close_within(phi.sum(-1), dla, tol, "sum_j phi_exact vs DLA")
    if hasattr(model.blocks[0], "ln1_post"):  # the correction matters for these models
        raw = phi_from_model(model, tokens, y, variant="raw")
        assert (raw.sum(-1) - dla).abs().max().item() > 10 * tol


def test_exact_dla_sums_with_rest_to_the_logit(tiny_models):
    """Frozen-norm identity on Gemma-3 (post-attention norms, offset RMSNorm): each
    layer's attention write into the residual stream (resid_mid - resid_pre, after
    the post-norm) dotted with the frozen-norm answer direction equals the sum of its
    heads' exact phi, and the final residual reproduces the actual logit of y."""
    model = tiny_models("gemma3")
    tokens = list(range(3, 20))
    y = 9
    phi = phi_from_model(model, tokens, y, variant="exact")
    with torch.no_grad():
        logits, cache = model.run_with_cache(
            torch.tensor([tokens]),
            names_filter=lambda n: n.endswith(("hook_resid_pre", "hook_resid_mid",
                                               "hook_resid_post", "ln_final.hook_scale")))
    u = model.W_U[:, y] * (model.ln_final.original_component.weight + 1.0)
    u = u / cache["ln_final.hook_scale"][0, -1, 0]
    for l in range(model.cfg.n_layers):
        mid, pre = cache[f"blocks.{l}.hook_resid_mid"], cache[f"blocks.{l}.hook_resid_pre"]
        write = mid[0, -1] - pre[0, -1]
        tol = model_tol(model, phi[l].abs().sum(), n_tokens=len(tokens), reads=4)
        assert_close_within(phi[l].sum(), write @ u, tol, f"layer {l} write")
    final = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"][0, -1]
    assert_close_within(final @ u, logits[0, -1, y],
                        model_tol(model, logits[0, -1], n_tokens=len(tokens)), "logit of y")
