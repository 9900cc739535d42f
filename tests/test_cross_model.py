"""Cross-model MLP patching (locos_tl.experiments.cross_model) on tiny models whose donor
differs from the base in MLP weights only: every MLP write at every position and layer
gives the donor's logits; none gives the base's; writes after a position leave it alone;
the references are margin.py's own margins; the summary's intervals are
``bootstrap_ci``'s; clear errors. Donors with the same weights but another config outside
the MLPs (RoPE, sliding window, norm eps) are refused naming the field; harmless fields
(``max_position_embeddings``, the MLP activation) keep the identity."""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest
import torch
from tolerances import assert_close_within, model_tol

from locos_tl import Trial, load_model
from locos_tl.errors import LocosError, TrialError
from locos_tl.experiments.cross_model import (
    COLUMNS,
    config_differences,
    mlp_patch_logits,
    mlp_patching,
    summarize_mlp_patching,
)
from locos_tl.experiments.margin import name_margin
from locos_tl.experiments.stats import bootstrap_ci

PROMPT = ("The quick brown fox jumps. {needle} The old man reads a book by the window. "
          "Which character has been to Dresden? The answer is")
NEEDLE = "Actually, Yuki lives next to the Semper Opera House."
QUESTION = "Which character has been to Dresden?"


@pytest.fixture(scope="module")
def pair(tiny_models, tiny_dirs):
    """``get(arch)``: ``(base, donor)``, the donor a fresh load of the same checkpoint
    with every MLP weight perturbed (seeded); nothing else differs."""
    cache = {}

    def get(arch):
        if arch not in cache:
            cache[arch] = (tiny_models(arch), _perturb_mlps(load_model(tiny_dirs[arch],
                                                                       device="cpu")))
        return cache[arch]

    return get


def _perturb_mlps(model):
    """``model`` with every MLP weight perturbed in place (seeded)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.original_model.named_parameters():
            if ".mlp." in name:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model


def _reconfigured(src, dest, **fields):
    """The checkpoint ``src`` (weights, tokenizer) copied to ``dest`` with ``fields`` of
    its ``config.json`` replaced, loaded."""
    shutil.copytree(src, dest)
    cfg = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**cfg, **fields}))
    return load_model(dest, device="cpu")


def _trial(model, i=0, question=True, distractors=("Stuart", "Katie", "Megan")):
    lead = ["", "Here we go. ", "In the evening the children walked. "][i]
    meta = {"character": "Yuki", "template": "completion",
            "distractor_names": list(distractors)}
    if question:
        meta["question"] = QUESTION
    return Trial.from_text(model, lead + PROMPT.format(needle=NEEDLE), NEEDLE, "Yuki",
                           meta=meta)


def _logits(model, tokens):
    with torch.no_grad():
        return model(tokens, return_type="logits")


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_every_write_everywhere_is_the_donor_and_none_is_the_base(pair, arch):
    base, donor = pair(arch)
    tokens = torch.tensor([list(_trial(base).tokens)])
    n = tokens.shape[1]
    want = _logits(donor, tokens)  # a plain forward of the donor, no hook
    assert float((want - _logits(base, tokens)).abs().max()) > 1.0  # the MLPs matter
    tol = model_tol(base, want, n_tokens=n)
    assert_close_within(mlp_patch_logits(base, donor, tokens, range(n)), want, tol, "all")
    plain = _logits(base, tokens)
    assert_close_within(mlp_patch_logits(base, donor, tokens, []), plain, tol, "none")
    # one layer alone at every position is neither
    one = mlp_patch_logits(base, donor, tokens, range(n), layers=[0])
    assert float((one - want).abs().max()) > 100 * tol


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_writes_after_a_position_do_not_reach_it(pair, arch):
    base, donor = pair(arch)
    tokens = torch.tensor([list(_trial(base).tokens)])
    n, k = tokens.shape[1], 30
    plain, got = _logits(base, tokens), mlp_patch_logits(base, donor, tokens, range(k + 1, n))
    assert_close_within(got[:, : k + 1], plain[:, : k + 1], model_tol(base, plain, n_tokens=n),
                        "up to k")
    assert float((got[:, k + 1 :] - plain[:, k + 1 :]).abs().max()) > 1.0


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_mlp_patching_rows(pair, arch):
    base, donor = pair(arch)
    trials = [_trial(base, i) for i in range(3)]
    sets = ["question", "needle", "both", "all", "none", "prompt"]
    df = mlp_patching(base, donor, trials, positions=sets, layers="each", progress=False)
    L = int(base.cfg.n_layers)
    assert list(df.columns) == COLUMNS
    assert len(df) == len(trials) * len(sets) * (L + 1)
    for t in trials:
        d = df[df.trial_id == t.trial_id].set_index(["positions", "layer"])
        # the references are margin.py's own margins (its engine: the SDPA twin)
        tol = model_tol(base, d["donor_margin"].abs().max() + d["base_margin"].abs().max(),
                        n_tokens=t.n_tokens + 1)
        ref_b, ref_d = name_margin(base, t), name_margin(donor, t)
        assert_close_within(d["base_margin"].iloc[0], ref_b["name_margin"], tol, "base")
        assert_close_within(d["donor_margin"].iloc[0], ref_d["name_margin"], tol, "donor")
        assert_close_within(d["donor_target_logprob"].iloc[0], ref_d["logp_target"], tol,
                            "donor logp")
        assert_close_within(d.loc[("all", "all"), "margin"], ref_d["name_margin"], tol, "all")
        assert_close_within(d.loc[("all", "all"), "target_logprob"], ref_d["logp_target"],
                            tol, "all logp")
        assert d.loc[("all", "all"), "recovered"] == pytest.approx(1.0, abs=1e-4)
        for layer in ["all", *range(L)]:
            assert d.loc[("none", layer), "margin"] == d.loc[("none", layer), "base_margin"]
            assert d.loc[("none", layer), "recovered"] == 0
        # the last layer's MLP writes only reach its own position: away from the answer
        # position (the question, the needle) they change nothing
        for pos in ("question", "needle", "both"):
            assert d.loc[(pos, L - 1), "margin"] == d.loc[(pos, L - 1), "base_margin"]
        q = d.loc[("question", "all")]
        assert q["n_positions"] > 0
        a, b = d.loc[("needle", "all"), "n_positions"], d.loc[("both", "all"), "n_positions"]
        assert b == a + q["n_positions"]  # the needle and the question do not overlap
        assert d.loc[("prompt", "all"), "n_positions"] == t.n_tokens


def test_summary_and_figure(pair):
    from locos_tl import plot

    base, donor = pair("qwen3")
    trials = [_trial(base, i) for i in range(3)]
    df = mlp_patching(base, donor, trials, positions=["needle", (0, 5)], layers="each",
                      progress=False)
    s = summarize_mlp_patching(df)
    assert list(s["positions"].unique()) == ["needle", "[0, 5)"]
    assert list(s["layer"])[:3] == ["all", 0, 1]
    for _, row in s.iterrows():
        g = df[(df.positions == row.positions) & (df.layer.astype(str) == str(row.layer))]
        assert row.n_trials == 3
        assert row.margin == pytest.approx(g.margin.mean(), abs=1e-12)
        gain = (g.margin - g.base_margin).to_numpy()
        assert (row.gain_low, row.gain_high) == bootstrap_ci(gain)
        assert (row.margin_low, row.margin_high) == bootstrap_ci(g.margin.to_numpy())
        assert row.recovered == pytest.approx(
            gain.mean() / (g.donor_margin.mean() - g.base_margin.mean()))
        lift = g.target_logprob.mean() - g.base_target_logprob.mean()
        assert row.recovered_target_logprob == pytest.approx(
            lift / (g.donor_target_logprob.mean() - g.base_target_logprob.mean()))
    fig = plot.mlp_patching_curves(s)
    assert [tr.name for tr in fig.data] == ["needle", "[0, 5)", "base", "donor"]
    assert np.allclose(fig.data[2].y, s.groupby(s.layer.astype(str), sort=False)
                       .base_margin.mean().loc[["0", "1", "all"]].to_numpy())
    assert list(fig.data[0].x) == ["0", "1", "all"]
    sel = s[s.positions == "needle"]
    want = sel.set_index(sel.layer.astype(str)).margin
    assert np.allclose(fig.data[0].y, want.loc[["0", "1", "all"]].to_numpy())
    with pytest.raises(ValueError, match="lacks column"):
        plot.mlp_patching_curves(df)
    lp = plot.mlp_patching_curves(s, metric="target_logprob")
    assert np.allclose(lp.data[0].y, sel.set_index(sel.layer.astype(str))
                       .target_logprob.loc[["0", "1", "all"]].to_numpy())
    with pytest.raises(ValueError, match="metric must be"):
        plot.mlp_patching_curves(s, metric="logits")


def test_errors(pair, tiny_models, tiny_dirs, tmp_path):
    base, donor = pair("llama")
    t = _trial(base)
    with pytest.raises(LocosError, match="LlamaForCausalLM.*Qwen3ForCausalLM"):
        mlp_patching(base, tiny_models("qwen3"), [t], progress=False)
    from locos_tl.models.tiny import byte_bpe_tokenizer, make_tiny_checkpoint

    wide = load_model(make_tiny_checkpoint("llama", tmp_path / "wide", seed=1,
                                           tokenizer=byte_bpe_tokenizer(),
                                           intermediate_size=96), device="cpu")
    with pytest.raises(LocosError, match="d_mlp"):
        mlp_patching(base, wide, [t], progress=False)
    with pytest.raises(TrialError, match="no question"):
        mlp_patching(base, donor, [_trial(base, question=False)], progress=False)
    # without the question, the needle alone needs none
    mlp_patching(base, donor, [_trial(base, question=False)], positions=["needle"],
                 progress=False)
    with pytest.raises(TrialError, match="no distractor names"):
        mlp_patching(base, donor, [_trial(base, distractors=())], progress=False)
    with pytest.raises(TrialError, match="one Trial"):
        mlp_patching(base, donor, t, progress=False)
    with pytest.raises(ValueError, match="unknown positions"):
        mlp_patching(base, donor, [t], positions=["answer"], progress=False)
    with pytest.raises(ValueError, match="list of position sets"):
        mlp_patching(base, donor, [t], positions="needle", progress=False)
    with pytest.raises(TrialError, match="positions"):
        mlp_patching(base, donor, [t], positions=[(5, 999)], progress=False)
    with pytest.raises((ValueError, TypeError), match="layers"):
        mlp_patching(base, donor, [t], layers="some", progress=False)
    with pytest.raises(ValueError, match="outside"):
        mlp_patch_logits(base, donor, torch.tensor([list(t.tokens)]), [t.n_tokens])
    # other weights outside the MLPs: allowed, with a warning
    other = load_model(tiny_dirs["llama"], device="cpu")
    with torch.no_grad():
        other.original_model.model.layers[0].self_attn.q_proj.weight.mul_(2)
    with pytest.warns(RuntimeWarning, match="outside the MLPs"):
        mlp_patching(base, other, [t], positions=["needle"], progress=False)


LLAMA_ROPE = {"rope_theta": 10000.0, "rope_type": "default"}  # the tiny checkpoints'
GEMMA_SLIDING_ROPE = {"rope_theta": 10000.0, "rope_type": "default"}
GEMMA_FULL_ROPE = {"rope_theta": 1000000.0, "rope_type": "default"}


@pytest.mark.parametrize("arch, fields, named", [
    ("llama", {"rope_parameters": {**LLAMA_ROPE, "rope_theta": 40000.0}},
     r"rope_parameters\.rope_theta: 10000\.0 vs 40000\.0"),
    ("llama", {"rope_parameters": {**LLAMA_ROPE, "rope_type": "linear", "factor": 2.0}},
     r"rope_parameters\.factor: absent vs 2\.0; rope_parameters\.rope_type: 'default' vs "
     r"'linear'"),
    ("gemma3", {"rope_parameters": {"full_attention": GEMMA_FULL_ROPE, "sliding_attention":
                                    {**GEMMA_SLIDING_ROPE, "rope_theta": 40000.0}}},
     r"rope_parameters\.sliding_attention\.rope_theta: 10000\.0 vs 40000\.0"),
    ("gemma3", {"sliding_window": 8}, r"sliding_window: 512 vs 8"),
    ("llama", {"rms_norm_eps": 0.1}, r"rms_norm_eps: 1e-06 vs 0\.1"),
], ids=["rope_theta", "rope_scaling", "nested_rope_theta", "sliding_window", "rms_norm_eps"])
def test_configs_differing_outside_the_mlps_are_refused(tiny_models, tiny_dirs, tmp_path,
                                                        arch, fields, named):
    base = tiny_models(arch)
    donor = _reconfigured(tiny_dirs[arch], tmp_path / "donor", **fields)  # same weights
    t = _trial(base)
    tokens = torch.tensor([list(t.tokens)])
    # the field alone changes the forward: no MLP patch can reproduce this donor
    plain = _logits(base, tokens)
    tol = model_tol(base, plain, n_tokens=t.n_tokens)
    assert float((_logits(donor, tokens) - plain).abs().max()) > 100 * tol
    with pytest.raises(LocosError, match=named):
        mlp_patching(base, donor, [t], positions=["needle"], progress=False)
    with pytest.raises(LocosError, match=named):
        mlp_patch_logits(base, donor, tokens, range(t.n_tokens))


@pytest.mark.parametrize("fields", [{"max_position_embeddings": 1024},
                                    {"hidden_act": "gelu_pytorch_tanh"}],
                         ids=["max_position_embeddings", "mlp_activation"])
def test_harmless_config_differences_keep_the_identity(tiny_models, tiny_dirs, tmp_path,
                                                       fields):
    base = tiny_models("llama")
    donor = _perturb_mlps(_reconfigured(tiny_dirs["llama"], tmp_path / "donor", **fields))
    tokens = torch.tensor([list(_trial(base).tokens)])
    n = tokens.shape[1]
    want = _logits(donor, tokens)
    assert float((want - _logits(base, tokens)).abs().max()) > 1.0
    tol = model_tol(base, want, n_tokens=n)
    assert_close_within(mlp_patch_logits(base, donor, tokens, range(n)), want, tol, "all")


def test_config_differences_rule(tiny_models):
    a = tiny_models("llama").original_model.config
    b = copy.deepcopy(a)
    b._name_or_path, b.transformers_version, b.dtype = "elsewhere", "9.9.9", "bfloat16"
    b.max_position_embeddings = 1024
    assert config_differences(a, b) == []
    assert config_differences(a, b, n_tokens=512) == []
    assert config_differences(a, b, n_tokens=513) == [
        "max_position_embeddings: 512 vs 1024 (below the 513-token sequence)"]
    b.rope_parameters = {**LLAMA_ROPE, "rope_type": "dynamic", "factor": 2.0}
    assert config_differences(a, b) == [
        "max_position_embeddings: 512 vs 1024 (RoPE type ['default', 'dynamic'] reads it)",
        "rope_parameters.factor: absent vs 2.0",
        "rope_parameters.rope_type: 'default' vs 'dynamic'"]
    c = copy.deepcopy(a)
    c.some_new_knob = 3  # unknown: refused by default
    assert config_differences(a, c) == ["some_new_knob: absent vs 3"]
