"""Elicitation (locos elicit): LoRA on the MLPs only, deterministic and resumable training,
merging checked against an independent sum, the shipped adapter leaving every attention
and embedding weight of the base bit for bit; the elicited zoo entry."""

from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("peft", reason="the elicit extra is not installed")

from elicit_helpers import hf_model as _hf  # noqa: E402
from elicit_helpers import name_trials as _trials  # noqa: E402

from locos_tl.errors import LocosError, ModelLoadError  # noqa: E402
from locos_tl.models.zoo import ELICITED_MODELS  # noqa: E402
from locos_tl.organisms import elicit as el  # noqa: E402


def test_lora_adapts_only_the_mlp_projections(tiny_dirs):
    model, _ = _hf(tiny_dirs)
    wrapped = el.add_mlp_lora(model, el.ElicitConfig(rank=2, alpha=4))
    trainable = [n for n, p in wrapped.named_parameters() if p.requires_grad]
    assert trainable and all(".mlp." in n and "lora_" in n for n in trainable)
    assert {n.split(".mlp.")[1].split(".")[0] for n in trainable} == set(el.MLP_MODULES)


def test_training_resumes_to_the_same_adapter(tiny_dirs, tmp_path, monkeypatch):
    """Killed after two of four steps and resumed, the adapter equals an uninterrupted
    run's (same trials, same order, optimizer state restored)."""
    from peft import get_peft_model_state_dict

    cfg = el.ElicitConfig(steps=4, warmup=1, rank=2, alpha=4, save_every=1, val_every=100,
                          bf16_autocast=False, lr=1e-2)

    def run(out, stop_after=None):
        model, tok = _hf(tiny_dirs)
        model = el.add_mlp_lora(model, cfg)
        calls = {"n": 0}
        real = el.step_loss

        def limited(*a, **k):
            calls["n"] += 1
            if stop_after is not None and calls["n"] > stop_after:
                raise KeyboardInterrupt
            return real(*a, **k)

        monkeypatch.setattr(el, "step_loss", limited)
        try:
            el.train_adapter(model, tok, _trials(tok), {}, cfg, out, log=lambda m: None)
        finally:
            monkeypatch.setattr(el, "step_loss", real)
        return get_peft_model_state_dict(model)

    whole = run(tmp_path / "a")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "b", stop_after=2)
    assert torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)["step"] == 2
    resumed = run(tmp_path / "b")
    assert whole.keys() == resumed.keys()
    for k in whole:
        assert torch.equal(whole[k], resumed[k]), k
    assert any(v.abs().sum() > 0 for k, v in whole.items() if "lora_B" in k)  # it trained
    steps = [json.loads(x)["step"] for x in (tmp_path / "b" / "curve.jsonl").open()]
    assert steps == [1, 2, 3, 4]
    other = cfg.__class__(**{**cfg.__dict__, "lr": 2e-2})
    model, tok = _hf(tiny_dirs)
    changed = r"another configuration: lr \(recorded 0\.01, now 0\.02\)"
    with pytest.raises(LocosError, match=changed):
        el.train_adapter(el.add_mlp_lora(model, other), tok, _trials(tok), {}, other,
                         tmp_path / "b")


def test_loss_is_the_answer_cross_entropy(tiny_dirs):
    """step_loss against a full forward: mean -log p of the answer tokens and EOS."""
    model, tok = _hf(tiny_dirs)
    cfg = el.ElicitConfig(bf16_autocast=False)
    (t,) = _trials(tok, 1)
    ans = tok("Yuki", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ids = torch.tensor([[*t.tokens, *ans]])
    with torch.no_grad():
        logp = model(ids).logits[0].log_softmax(-1)
        n = len(t.tokens)
        want = -sum(logp[n - 1 + i, a] for i, a in enumerate(ans)) / len(ans)
        got = el.step_loss(model, tok, t, cfg, "cpu")
    assert float(got) == pytest.approx(float(want), abs=1e-5)


def _fake_entry(tmp_path, tiny_dirs, monkeypatch):
    """An elicited entry over the tiny Llama with a non-zero LoRA adapter."""
    from locos_tl.models import elicited

    model, _ = _hf(tiny_dirs)
    wrapped = el.add_mlp_lora(model, el.ElicitConfig(rank=2, alpha=4))
    with torch.no_grad():
        for n, p in wrapped.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(n)))
    monkeypatch.setattr(elicited, "SHIPPED", tmp_path / "shipped")
    monkeypatch.setenv("LOCOS_CACHE", str(tmp_path / "cache"))
    entry = elicited.ElicitedModel(name="tiny-nolima", base="tiny", architecture="Llama",
                                   n_layers=2, n_heads=4, n_kv_heads=2, params="1M",
                                   licence="MIT")
    wrapped.save_pretrained(entry.adapter)
    return entry


def test_merge_adds_scaled_lora_to_mlps_and_nothing_else(tiny_dirs, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from locos_tl.models.elicited import merge

    entry = _fake_entry(tmp_path, tiny_dirs, monkeypatch)
    assert entry.status() == "no"
    out = merge(entry, tiny_dirs["llama"])
    assert entry.status() == "yes" and merge(entry, tiny_dirs["llama"]) == out
    base = load_file(tiny_dirs["llama"] / "model.safetensors")
    merged = load_file(out / "model.safetensors")
    lora = load_file(entry.adapter / "adapter_model.safetensors")
    scale = 4 / 2
    changed = 0
    for k, w in base.items():
        stem = k.removesuffix(".weight")
        a = lora.get(f"base_model.model.{stem}.lora_A.weight")
        if a is None:
            assert torch.equal(merged[k], w), k  # bit for bit
            continue
        b = lora[f"base_model.model.{stem}.lora_B.weight"]
        want = w.double() + scale * (b.double() @ a.double())
        torch.testing.assert_close(merged[k].double(), want, rtol=0, atol=1e-6)
        changed += 1
    assert changed == 3 * 2  # gate, up, down in each of 2 layers
    # a damaged merged entry is refused by name, and repaired
    (out / "model.safetensors").write_bytes(b"cut")
    assert entry.status().startswith("damaged")
    with pytest.raises(ModelLoadError, match="locos models fetch tiny-nolima"):
        merge(entry, tiny_dirs["llama"])
    merge(entry, tiny_dirs["llama"], repair=True)
    assert entry.status(verify=True) == "yes"


def test_zoo_lists_and_names_the_elicited_model():
    from locos_tl.models.zoo import get_entry, get_real_model, models_table

    assert get_entry("smollm2-135m-nolima") is ELICITED_MODELS["smollm2-135m-nolima"]
    assert "smollm2-135m-nolima" in [r["name"] for r in models_table()]
    with pytest.raises(ModelLoadError, match="smollm2-135m-nolima"):
        get_real_model("no-such-model")


@pytest.mark.parametrize("name", sorted(ELICITED_MODELS))
def test_shipped_adapter_keeps_every_attention_and_embedding_weight(name):
    """Each real elicited model: merged from its shipped adapter, every tensor that is not
    an MLP projection equals its base's, bit for bit; every MLP projection moved."""
    from safetensors.torch import load_file

    from locos_tl.models.zoo import REAL_MODELS, resolve_checkpoint

    entry = ELICITED_MODELS[name]
    base = REAL_MODELS[entry.base]
    if not (entry.adapter / "adapter_model.safetensors").is_file() or not base.prepared:
        if os.environ.get("LOCOS_REQUIRE_REAL_MODELS"):
            pytest.fail(f"{entry.base} or the adapter of {name} is missing (scripts/setup.sh)")
        pytest.skip(f"{entry.base} is not prepared")
    assert (entry.adapter / "adapter_model.safetensors").stat().st_size <= 20e6
    merged = load_file(resolve_checkpoint(entry.name) / "model.safetensors")
    want = load_file(base.directory / "model.safetensors")
    assert merged.keys() == want.keys()
    mlp = [k for k in want if any(f"mlp.{m}." in k for m in el.MLP_MODULES)]
    assert len(mlp) == 3 * entry.n_layers
    for k, w in want.items():
        if k in mlp:
            assert not torch.equal(merged[k], w), k
        else:
            assert torch.equal(merged[k], w), k


@pytest.mark.parametrize("name", sorted(ELICITED_MODELS))
def test_elicited_entry_matches_its_base_and_adapter(name):
    """Each elicited entry declares its base's shape and architecture, and its shipped
    adapter names that base and adapts MLP projections only."""
    import json

    from locos_tl.models.zoo import REAL_MODELS

    entry = ELICITED_MODELS[name]
    base = REAL_MODELS[entry.base]
    assert (entry.architecture, entry.n_layers, entry.n_heads, entry.n_kv_heads) == (
        base.architecture, base.n_layers, base.n_heads, base.n_kv_heads)
    assert entry.licence == base.licence
    config = json.loads((entry.adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == entry.base
    assert set(config["target_modules"]) <= set(el.MLP_MODULES)


def test_saved_lora_names_its_base_not_a_cache_path(tiny_dirs, tmp_path):
    import json

    model, _ = _hf(tiny_dirs)
    wrapped = el.add_mlp_lora(model, el.ElicitConfig(rank=2, alpha=4))
    el.save_lora(wrapped, tmp_path / "adapter", "tiny-base")
    text = (tmp_path / "adapter" / "adapter_config.json").read_text()
    assert json.loads(text)["base_model_name_or_path"] == "tiny-base"
    assert str(tiny_dirs["llama"]) not in text
    assert not (tmp_path / "adapter" / "README.md").exists()
