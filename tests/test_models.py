"""load_model: local checkpoints load offline; bad names and directories fail clearly."""

import json

import pytest
import torch
import transformers

from locos_tl import ModelLoadError, load_model


def test_loads_local_checkpoint_with_dtype(tiny_dirs):
    m = load_model(tiny_dirs["llama"], device="cpu", dtype="bfloat16")
    assert next(m.parameters()).dtype == torch.bfloat16
    assert m.cfg.n_layers == 2 and m.cfg.n_heads == 4 and m.cfg.n_key_value_heads == 2
    assert m.tokenizer is not None


def test_missing_directory_and_not_a_model_dir(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nope")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(tmp_path)


def test_unknown_hub_name_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="could not load model 'nobody/no-such-model-xyz'"):
        load_model("nobody/no-such-model-xyz", device="cpu")


def test_architecture_without_adapter(tmp_path):
    cfg = transformers.BioGptConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=32)
    transformers.BioGptForCausalLM(cfg).save_pretrained(tmp_path)
    archs = json.loads((tmp_path / "config.json").read_text())["architectures"]
    assert archs == ["BioGptForCausalLM"]
    with pytest.raises(ModelLoadError, match="BioGptForCausalLM .* has no TransformerLens bridge"):
        load_model(tmp_path)


def test_bad_dtype(tiny_dirs):
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        load_model(tiny_dirs["llama"], dtype="float8")
