"""Ablating or patching one head changes no other head's ``hook_z`` (every architecture).

The ablated head itself is checked against an independent HF eager forward: for the query
modes, the authors' hook (``q_proj`` output of head ``h`` replaced) on a plain
``transformers`` model; for ``query_zero`` also the running mean of the values (uniform
attention over the prefix); for the output modes, 0 or the calibration mean. On OLMo-2,
whose ``q_norm`` is one RMSNorm over all heads, the authors' hook also rescales the other
heads of the layer; locos_tl's does not.
"""

from __future__ import annotations

import pytest
import torch
from tolerances import assert_close_within, model_tol

from locos_tl.engine.ablation import ABLATION_MODES, ablate, calibrate_means, shared_q_norm
from locos_tl.engine.decode import greedy_decode
from locos_tl.experiments.clean_corrupted import last_logits
from locos_tl.experiments.patching import head_patch_hook
from locos_tl.models.tiny import ARCHS

TOKENS = torch.tensor([[5 + (7 * i) % 300 for i in range(24)]])
HEADS = [(1, 0), (0, 3)]  # (1, 0): the last layer, first kv group; (0, 3): the second kv group


def _z_tol(model, z, layer):
    """Summation-order tolerance of layer ``layer``'s ``hook_z`` (tests/tolerances.py)."""
    return model_tol(model, z, n_tokens=TOKENS.shape[1], layers=layer, reads=2)


@pytest.fixture(scope="module", params=ARCHS)
def arch(request, tiny_models, tiny_dirs):
    """``(name, bridge, plain HF eager model, calibration means)`` per architecture."""
    from transformers import AutoModelForCausalLM

    name = request.param
    model = tiny_models(name)
    hf = AutoModelForCausalLM.from_pretrained(tiny_dirs[name], attn_implementation="eager",
                                              dtype=torch.float32).eval()
    means = calibrate_means(model, ["The quick brown fox jumps over the lazy dog.",
                                    [11, 12, 13, 14, 15, 16, 17]])
    return name, model, hf, means


def _bridge_z(model, tokens=TOKENS):
    """``hook_z`` of every layer, ``[n_layers][pos, n_heads, d_head]`` (after any hook
    already attached, e.g. an ablation)."""
    got = {}

    def keep(x, hook):
        got[int(hook.name.split(".")[1])] = x[0].detach().clone()

    L = int(model.cfg.n_layers)
    with torch.no_grad(), model.hooks(fwd_hooks=[(f"blocks.{l}.attn.hook_z", keep)
                                                 for l in range(L)]):
        model(tokens)
    return [got[l] for l in range(L)]


def _hf_run(hf, layer, replace=None, tokens=TOKENS):
    """Plain HF eager forward; ``replace``: ``{head: [d_head] value}`` written into layer
    ``layer``'s ``q_proj`` output (the authors' query hook). Returns the ``o_proj`` input
    ``[pos, n_heads, d_head]`` and the ``v_proj`` output ``[pos, n_kv, d_head]`` of
    ``layer``."""
    attn = hf.model.layers[layer].self_attn
    d = attn.head_dim
    got = {}

    def on_q(mod, args, out):
        if not replace:
            return None
        out = out.clone().view(*out.shape[:-1], -1, d)
        for h, value in replace.items():
            out[..., h, :] = value
        return out.view(*out.shape[:-2], -1)

    handles = [attn.q_proj.register_forward_hook(on_q),
               attn.v_proj.register_forward_hook(
                   lambda m, a, out: got.__setitem__("v", out[0].view(out.shape[1], -1, d))),
               attn.o_proj.register_forward_pre_hook(
                   lambda m, a: got.__setitem__("z", a[0][0].view(a[0].shape[1], -1, d)))]
    try:
        with torch.no_grad():
            hf(tokens)
    finally:
        for handle in handles:
            handle.remove()
    return got["z"], got["v"]


def test_bridge_hook_z_equals_hf_o_proj_input(arch) -> None:
    name, model, hf, _ = arch
    z = _bridge_z(model)
    for l in range(int(model.cfg.n_layers)):
        ref = _hf_run(hf, l)[0]
        assert_close_within(z[l], ref, _z_tol(model, ref, l), f"hook_z L{l} vs HF")


def test_only_olmo_has_a_shared_query_norm(arch) -> None:
    name, model, _, _ = arch
    shared = [shared_q_norm(model, l) is not None for l in range(int(model.cfg.n_layers))]
    assert shared == [name == "olmo2"] * len(shared)


@pytest.mark.parametrize("mode", ABLATION_MODES)
@pytest.mark.parametrize("head", HEADS)
def test_ablation_changes_only_the_ablated_head(arch, mode, head) -> None:
    name, model, hf, means = arch
    l, h = head
    H = int(model.cfg.n_heads)
    clean = _bridge_z(model)
    with ablate(model, [head], mode, means=means):
        abl = _bridge_z(model)
    # every other head of layer l, and every head of the layers before it: unchanged
    others = [g for g in range(H) if g != h]
    tol = _z_tol(model, clean[l], l)
    assert_close_within(abl[l][:, others], clean[l][:, others], tol, "other heads")
    for k in range(l):
        assert_close_within(abl[k], clean[k], _z_tol(model, clean[k], k), "earlier layers")
    got = abl[l][:, h]
    assert (got - clean[l][:, h]).abs().max() > 1e-3  # the ablation did something

    if mode == "output_zero":
        assert torch.equal(got, torch.zeros_like(got))
    elif mode == "output_mean":
        torch.testing.assert_close(got, means.z[l, h].expand_as(got), atol=0, rtol=0)
    else:
        value = means.q[l, h] if mode == "query_mean" else torch.zeros_like(means.q[l, h])
        ref_z, v = _hf_run(hf, l, {h: value})
        # the ablated head gets exactly the query the authors' q_proj hook gives it
        assert_close_within(got, ref_z[:, h], tol, "ablated head vs HF")
        if mode == "query_zero":  # uniform attention over the prefix: running mean of v
            v_h = v[:, h // (H // v.shape[1])]  # GQA: the kv head query head h reads
            running = v_h.cumsum(0) / torch.arange(1, v_h.shape[0] + 1).unsqueeze(1)
            assert_close_within(got, running, tol, "uniform attention: running mean")
        # the authors' hook: on OLMo's shared q_norm it rescales the other heads too
        moved = (ref_z[:, others] - clean[l][:, others]).abs().max()
        if name == "olmo2":
            assert moved > 0.1
        else:
            assert moved < tol


@pytest.mark.parametrize("mode", ["query_mean", "query_zero"])
def test_two_heads_of_one_layer_match_the_authors_values(arch, mode) -> None:
    name, model, hf, means = arch
    heads, others = [1, 2], [0, 3]
    clean = _bridge_z(model)
    with ablate(model, [(1, h) for h in heads], mode, means=means):
        abl = _bridge_z(model)
    tol = _z_tol(model, clean[1], 1)
    assert_close_within(abl[1][:, others], clean[1][:, others], tol, "other heads")
    fill = means.q if mode == "query_mean" else torch.zeros_like(means.q)
    ref_z, _ = _hf_run(hf, 1, {h: fill[1, h] for h in heads})
    assert_close_within(abl[1][:, heads], ref_z[:, heads], tol, "ablated heads vs HF")


def test_shared_norm_ablation_holds_through_kv_cache_decoding(tiny_models) -> None:
    model = tiny_models("olmo2")
    steps = []
    with torch.no_grad(), ablate(model, [(1, 0), (0, 2)], "query_zero"):
        greedy_decode(model, TOKENS[0].tolist(), max_new_tokens=2, prefill_mode="bridge",
                      on_step=steps.append)
        full = model(torch.tensor([TOKENS[0].tolist() + [steps[0].token]]))[0, -1]
    clean = model(torch.tensor([TOKENS[0].tolist() + [steps[0].token]]))[0, -1]
    tol = model_tol(model, full, n_tokens=TOKENS.shape[1] + 1)
    assert (full - clean).abs().max() > 10 * tol
    assert_close_within(steps[1].logits, full, tol, "cached decode vs full forward")


@pytest.mark.parametrize("layer", [0, 1])
def test_patching_changes_only_the_patched_head(arch, layer) -> None:
    """CRI's patch hook, run as ``cri_trial`` runs it (query chunks of 7 on a KV cache,
    one patched head per batch row): the patched head gets the clean ``hook_z``, every
    other head keeps the corrupted run's."""
    _, model, _, _ = arch
    H = int(model.cfg.n_heads)
    clean_ids = TOKENS
    corr_ids = TOKENS.clone()
    corr_ids[0, 8:13] = torch.tensor([40, 41, 42, 43, 44])
    clean = _bridge_z(model, clean_ids)
    pairs = [(0, 1), (1, 2)]  # (batch row, head)
    ids = corr_ids.expand(len(pairs), -1).contiguous()

    def run(patch: bool) -> dict[int, torch.Tensor]:
        state, got = {"start": 0}, {}

        def keep(x, hook):
            got.setdefault(int(hook.name.split(".")[1]), []).append(x.detach().clone())

        hooks = [(f"blocks.{layer}.attn.hook_z",
                  head_patch_hook(clean[layer], pairs, state, offset=0))] if patch else []
        hooks += [(f"blocks.{l}.attn.hook_z", keep) for l in range(int(model.cfg.n_layers))]
        last_logits(model, ids, chunk_size=7, fwd_hooks=hooks, state=state)
        return {l: torch.cat(parts, dim=1) for l, parts in got.items()}  # [batch, pos, H, d]

    corr, z = run(patch=False), run(patch=True)  # same batch and chunks: same numerics
    for row, h in pairs:
        others = [g for g in range(H) if g != h]
        assert (clean[layer][:, h] - corr[layer][row, :, h]).abs().max() > 1e-3
        assert torch.equal(z[layer][row, :, h], clean[layer][:, h])
        assert_close_within(z[layer][row, :, others], corr[layer][row, :, others],
                            _z_tol(model, corr[layer][row], layer), "other heads")
        for k in range(layer):
            assert_close_within(z[k][row], corr[k][row], _z_tol(model, corr[k][row], k),
                                "earlier layers")
