"""Attention-score attribution (locos_tl.experiments.score_attribution): the query-side
and key-side contributions add up to the model's own ``hook_attn_scores`` on tiny Llama,
Qwen3 (per-head QK-norm), Gemma-3 (offset norms, post-attention norms, its own scaling)
and OLMo-2 (shared QK-norm, no input norm); a zeroed component contributes 0; removing a
component from one forward with the norm scales frozen moves the model's score by
exactly its contribution; clear refusals."""

from __future__ import annotations

import warnings

import pytest
import torch
from tolerances import assert_close_within, model_tol

from locos_tl import Trial
from locos_tl.errors import TrialError
from locos_tl.experiments.score_attribution import COLUMNS, score_attribution

ARCHS = ["llama", "qwen3", "gemma3", "olmo2"]
HEADS = [(0, 1), (1, 0), (1, 3)]
SPAN = (4, 9)


def _trial(model, n: int = 20, seed: int = 0) -> Trial:
    g = torch.Generator().manual_seed(seed)
    return Trial(tokens=torch.randint(1, 380, (n,), generator=g).tolist(), needle_span=SPAN,
                 answer="x", trial_id=f"t{seed}").with_tokenizer(model)


def _scores(model, tokens, fwd_hooks=()):
    """``hook_attn_scores`` of every layer, ``[n_layers, n_heads, q, k]``, float64."""
    names = [f"blocks.{l}.attn.hook_attn_scores" for l in range(int(model.cfg.n_layers))]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an edited hook_scale takes the python norm path
        with model.hooks(fwd_hooks=list(fwd_hooks)):
            _, cache = model.run_with_cache(torch.tensor([tokens]), names_filter=names)
    return torch.stack([cache[n][0].double() for n in names])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("split_heads", [False, True])
def test_contributions_add_up_to_the_models_score(tiny_models, arch, split_heads):
    model = tiny_models(arch)
    trials = [_trial(model, seed=0), _trial(model, seed=1)]
    df = score_attribution(model, trials, HEADS, split_heads=split_heads)
    assert list(df.columns) == COLUMNS
    assert set(df["side"]) == {"query", "key"}
    comps = set(df["component"])
    assert {"embed", "L0.mlp"} <= comps
    assert ("L0H3" in comps) == split_heads and ("L0.attn" in comps) != split_heads
    assert "bias" not in comps  # no projection bias in these checkpoints
    for t in trials:
        ref = _scores(model, list(t.tokens))  # the bridge's own forward, run again
        i = t.n_tokens - 1
        for (l, h), g in df[df.trial_id == t.trial_id].groupby(["layer", "head"]):
            for side, gs in g.groupby("side"):
                per_key = gs.groupby("key_pos")["contribution"].sum()
                exact = ref[l, h, i, SPAN[0]:SPAN[1]]
                tol = model_tol(model, exact, n_tokens=t.n_tokens, layers=l, reads=2)
                assert_close_within(torch.tensor(per_key.to_numpy()), exact, tol,
                                    f"{arch} L{l}H{h} {side} side")
                assert_close_within(torch.tensor(gs.groupby("key_pos")["exact_score"].first()
                                                 .to_numpy()), exact, tol, "exact score")
                assert_close_within(torch.tensor(gs["residual"].to_numpy()),
                                    torch.zeros(len(gs)), tol, "residual")
                if l == 0:  # only the embedding writes before layer 0
                    assert set(gs["component"]) == {"embed"}
    # summing over the span: the same numbers added up
    summed = score_attribution(model, trials[:1], HEADS, keys="sum", split_heads=split_heads)
    assert summed["key_pos"].isna().all()
    each = df[df.trial_id == trials[0].trial_id]
    a = each.groupby(["layer", "head", "side", "component"], sort=True)["contribution"].sum()
    b = summed.set_index(["layer", "head", "side", "component"]).sort_index()["contribution"]
    assert_close_within(torch.tensor(b.to_numpy()), torch.tensor(a.to_numpy()), 1e-9,
                        "sum over keys")


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_per_head_writes_add_up_to_the_layer(tiny_models, arch):
    """Split heads (with a frozen post-attention norm on Gemma-3) sum to the layer's
    write: the same contribution either way."""
    model = tiny_models(arch)
    t = _trial(model, seed=2)
    whole = score_attribution(model, [t], [(1, 2)])
    heads = score_attribution(model, [t], [(1, 2)], split_heads=True)
    for side in ("query", "key"):
        a = whole[(whole.side == side) & (whole.component == "L0.attn")]
        b = heads[(heads.side == side) & heads.component.str.match(r"L0H\d")]
        per_key = b.groupby("key_pos")["contribution"].sum().to_numpy()
        tol = model_tol(model, a["exact_score"].to_numpy().copy(), n_tokens=t.n_tokens,
                        reads=2)
        assert_close_within(torch.tensor(per_key), torch.tensor(a["contribution"].to_numpy()),
                            tol, f"{arch} {side}")


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_a_zeroed_component_contributes_nothing(tiny_models, arch):
    model = tiny_models(arch)
    zero = [("blocks.0.hook_mlp_out", lambda x, hook: torch.zeros_like(x))]
    with model.hooks(fwd_hooks=zero):
        df = score_attribution(model, [_trial(model)], [(1, 1)])
    assert (df.loc[df.component == "L0.mlp", "contribution"] == 0).all()
    assert (df.loc[df.component != "L0.mlp", "contribution"] != 0).all()


def _frozen(model, names):
    """The hook values ``names`` of one clean forward, and hooks writing them back."""
    got = {}
    hooks = [(n, lambda x, hook, n=n: got.__setitem__(n, x.detach().clone())) for n in names]
    return got, hooks


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("side", ["query", "key"])
def test_removing_a_component_under_frozen_scales_moves_the_score_by_it(tiny_models, arch,
                                                                         side):
    """The model's own forward with MLP 0's write removed at one position (the query, or
    one needle key) and layer 1's input-norm and QK-norm scales held at their clean values:
    its score changes by minus that component's contribution, as computed on the clean
    forward."""
    model = tiny_models(arch)
    t = _trial(model, seed=3)
    i, j, h = t.n_tokens - 1, SPAN[0] + 2, 2
    df = score_attribution(model, [t], [(1, h)])
    contrib = df[(df.side == side) & (df.component == "L0.mlp")].set_index("key_pos")
    a = "blocks.1.attn"
    names = ["blocks.1.ln1.hook_scale"] + [f"{a}.{w}_norm.hook_scale" for w in "qk"
                                           if hasattr(model.blocks[1].attn, f"{w}_norm")]
    clean, keep = _frozen(model, names)
    ref = _scores(model, list(t.tokens), keep)
    pos = i if side == "query" else j

    def remove(x, hook):
        x = x.clone()
        x[:, pos] = 0
        return x

    freeze = [(n, lambda x, hook, n=n: clean[n]) for n in names]
    moved = _scores(model, list(t.tokens), [("blocks.0.hook_mlp_out", remove), *freeze])
    delta = (moved - ref)[1, h, i, SPAN[0]:SPAN[1]]
    expect = -torch.tensor(contrib["contribution"].to_numpy())
    if side == "key":  # only key j lost its MLP write
        expect = torch.where(torch.arange(*SPAN) == j, expect, torch.zeros_like(expect))
    tol = model_tol(model, ref[1, h, i], n_tokens=t.n_tokens, reads=2)
    assert_close_within(delta, expect, tol, f"{arch} {side}")
    assert float(expect.abs().max()) > 100 * tol  # a real change, not rounding


def test_refusals(tiny_models, windowed, monkeypatch):
    gemma = tiny_models("gemma3")
    t = _trial(gemma)
    monkeypatch.setattr(gemma.blocks[1].attn.original_component, "attn_logit_softcapping",
                        50.0, raising=False)
    with pytest.raises(NotImplementedError, match="Gemma3ForCausalLM.*soft-capping"):
        score_attribution(gemma, [t], [(1, 0)])
    score_attribution(gemma, [t], [(0, 0)])  # layer 0 is still linear
    monkeypatch.undo()
    llama = tiny_models("llama")
    monkeypatch.setattr(llama.cfg, "positional_embedding_type", "standard")
    with pytest.raises(NotImplementedError, match="LlamaForCausalLM.*rotary"):
        score_attribution(llama, [t], [(0, 0)])
    monkeypatch.undo()
    with pytest.raises(TrialError, match="one Trial"):
        score_attribution(llama, t, [(0, 0)])
    with pytest.raises(TrialError, match="not before the query"):
        score_attribution(llama, [t], [(0, 0)], query_pos=6)
    with pytest.raises(TrialError, match="outside"):
        score_attribution(llama, [t], [(0, 0)], query_pos=99)
    # a Literal: the type check refuses it under the tests' jaxtyping hook, else ValueError
    with pytest.raises((ValueError, TypeError), match="keys"):
        score_attribution(llama, [t], [(0, 0)], keys="mean")
    # Gemma-3 with a sliding window of 8: keys 4..8 are outside the window of query 19
    with pytest.raises(ValueError, match="masked.*sliding window"):
        score_attribution(windowed("gemma3"), [t], [(0, 0)])


def test_score_attribution_bars(tiny_models):
    from locos_tl import plot

    model = tiny_models("qwen3")
    trials = [_trial(model, seed=0), _trial(model, seed=1)]
    df = score_attribution(model, trials, [(1, 0), (1, 3)])
    fig = plot.score_attribution_bars(df, "L1H3")
    assert [tr.name for tr in fig.data] == ["query side", "key side"]
    sel = df[(df.label == "L1H3") & (df.side == "key")]
    want = sel.groupby(["component", "trial_id"])["contribution"].sum().groupby(
        "component").mean()
    got = dict(zip(fig.data[1].x, fig.data[1].y, strict=True))
    assert got == pytest.approx(want.to_dict(), abs=1e-12)
    assert "L1H3" in fig.layout.title.text
    assert plot.score_attribution_bars(df).layout.title.text.startswith("L1H0")
    with pytest.raises(ValueError, match="not in the table"):
        plot.score_attribution_bars(df, "L0H0")


def test_projection_biases(tiny_dirs):
    """Biases on q_proj, k_proj (a ``bias`` row on each side) and o_proj (an
    ``L0.attn_bias`` component with split heads), as Qwen2 has: still the model's score."""
    from locos_tl import load_model

    model = load_model(tiny_dirs["qwen3"], device="cpu")  # a fresh copy, changed below
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for layer in model.original_model.model.layers:
            for name in ("q_proj", "k_proj", "o_proj"):
                lin = getattr(layer.self_attn, name)
                lin.bias = torch.nn.Parameter(torch.randn(lin.out_features, generator=g))
    t = _trial(model, seed=4)
    ref = _scores(model, list(t.tokens))[1, 2, t.n_tokens - 1, SPAN[0]:SPAN[1]]
    df = score_attribution(model, [t], [(1, 2)], split_heads=True)
    assert {"bias", "L0.attn_bias"} <= set(df["component"])
    assert (df.loc[df.component == "bias", "contribution"].abs() > 1e-3).all()
    tol = model_tol(model, ref, n_tokens=t.n_tokens, reads=2)
    for side, gs in df.groupby("side"):
        per_key = torch.tensor(gs.groupby("key_pos")["contribution"].sum().to_numpy())
        assert_close_within(per_key, ref, tol, f"biased {side}")


def test_the_organisms_nonliteral_writers():
    """A trained model (the organism ``retrieval-2l``, Qwen3 architecture): the identity
    holds, and the needle's keys meet the non-literal writers' query mostly through head
    L0H0's write at the needle, the head whose ablation alone drops non-literal accuracy
    to 0.04 (its model card). Measured (6 trials, seed 3, 128 tokens, summed over the
    needle): key side L0H0 17.8 and 17.5, next L0.mlp 11.7 and 11.2; scores 23.7, 22.2."""
    from pathlib import Path

    from locos_tl import load_model
    from locos_tl.organisms.tasks import make_trials

    org = load_model(Path(__file__).resolve().parents[1] / "data" / "organisms" /
                     "retrieval-2l", device="cpu")
    trials = make_trials("nonliteral", 6, 128, seed=3)
    df = score_attribution(org, trials, [(1, 0), (1, 1)], keys="sum", split_heads=True)
    tol = model_tol(org, df["exact_score"].to_numpy().copy(), n_tokens=128, layers=1, reads=2)
    assert_close_within(torch.tensor(df["residual"].to_numpy()), torch.zeros(len(df)), tol,
                        "organism residual")
    key = df[df.side == "key"].groupby(["label", "component"])["contribution"].mean()
    for label in ("L1H0", "L1H1"):
        top = key[label].sort_values(ascending=False)
        assert top.index[0] == "L0H0" and top.iloc[0] > 1.3 * top.iloc[1], top
