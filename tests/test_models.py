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


# ------------------------------------------------------------- GGUF files and the zoo
# A tiny random Llama written as a Q8_0 GGUF file (tests/gguf_tiny.py); the real models'
# exactness is tested in tests/test_real_models.py.



def test_gguf_loads_like_transformers_and_is_cached_by_sha256(tiny_gguf, cache):
    import hashlib

    from gguf_tiny import CHAT_TEMPLATE
    from tolerances import assert_close_within, model_tol
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from locos_tl.data.hub import load_tokenizer
    from locos_tl.runs.provenance import provenance

    bridge = load_model(tiny_gguf, device="cpu")
    sha = hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    d = cache / "gguf" / sha
    assert sorted(p.name for p in cache.joinpath("gguf").iterdir()) == [sha]
    assert (d / "model.safetensors").is_file()
    source = json.loads((d / "gguf_source.json").read_text())
    assert source["sha256"] == sha and source["quantization"] == "Q8_0"
    assert source["tensor_types"] == {"Q8_0": 15, "F32": 5}  # 1 + 2 x 7 matrices; norms
    # same numbers as transformers' own GGUF loader (float32; the bridge's eager attention
    # against HF's default SDPA: summation order only)
    ref = AutoModelForCausalLM.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name,
                                               dtype=torch.float32).eval()
    from safetensors.torch import load_file

    saved, want_sd = load_file(d / "model.safetensors"), ref.state_dict()
    assert set(saved) == set(want_sd) - {"lm_head.weight"}  # tied: stored once
    assert all(torch.equal(saved[k], want_sd[k]) for k in saved)
    hf = bridge.original_model
    ids = torch.tensor([bridge.tokenizer("The cat sat on the mat.").input_ids])
    with torch.no_grad():
        got, want = bridge(ids, return_type="logits")[0], ref(ids).logits[0]
    assert_close_within(got, want, model_tol(bridge, want, n_tokens=ids.shape[1]), "logits")
    # tied embeddings survive the rebuild; the chat template is kept
    assert hf.config.tie_word_embeddings
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    ref_tok = AutoTokenizer.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name)
    assert bridge.tokenizer.chat_template == ref_tok.chat_template == CHAT_TEMPLATE
    # the cached tokenizer encodes as the GGUF one (no BOS added: the bridge's own
    # tokenizer adds one, TransformerLens's choice)
    tok = load_tokenizer(tiny_gguf)
    text = "a needle in a haystack"
    assert tok(text).input_ids == ref_tok(text).input_ids
    assert tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False) == \
        ref_tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False)
    meta = provenance(bridge)["model"]
    assert meta["source"] == {"format": "gguf", "registry_name": None, "packages": None,
                              "source_file": str(tiny_gguf.resolve()), "sha256": sha,
                              "quantization": "Q8_0", "size_bytes": tiny_gguf.stat().st_size}


def test_second_load_reads_the_cache(tiny_gguf, cache, tmp_path, monkeypatch):
    import shutil

    import locos_tl.models.gguf_cache as gc

    first = gc.prepare_gguf(tiny_gguf)

    def no_convert(*a, **k):
        raise AssertionError("dequantized again")

    monkeypatch.setattr(gc, "_convert", no_convert)
    copy = shutil.copy(tiny_gguf, tmp_path / "renamed.gguf")  # same bytes, same key
    assert gc.prepare_gguf(copy) == first
    m = load_model(copy, device="cpu")
    assert m.cfg.n_layers == 2 and m.cfg.n_heads == 4 and m.cfg.n_key_value_heads == 2
    changed = tmp_path / "changed.gguf"  # one byte of the last tensor differs: new key
    data = bytearray(tiny_gguf.read_bytes())
    data[-1] ^= 1
    changed.write_bytes(data)
    with pytest.raises(AssertionError, match="dequantized again"):
        gc.prepare_gguf(changed)
    assert not list(cache.joinpath("gguf").glob("*.tmp-*"))  # no half-written directory


def test_gguf_errors(tmp_path, cache, monkeypatch):
    import sys

    with pytest.raises(ModelLoadError, match="GGUF file .*missing.gguf.* does not exist"):
        load_model(tmp_path / "missing.gguf")
    fake = tmp_path / "fake.gguf"
    fake.write_text("not a gguf file")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_model(fake)
    real = tmp_path / "real.gguf"
    real.write_bytes(b"GGUF" + bytes(20))
    monkeypatch.setitem(sys.modules, "gguf", None)  # the extra is not installed
    with pytest.raises(ModelLoadError, match=r"locos_tl\[gguf\]"):
        load_model(real)


def test_registry_name_not_fetched_says_how(cache, monkeypatch):
    import dataclasses

    from locos_tl.models import zoo

    entry = dataclasses.replace(zoo.REAL_MODELS["smollm2-135m-instruct"],
                                packages=("no-such-package-locos==0.1",))
    monkeypatch.setitem(zoo.REAL_MODELS, entry.name, entry)
    with pytest.raises(ModelLoadError, match="locos models fetch smollm2-135m-instruct"):
        load_model("smollm2-135m-instruct", device="cpu")
    with pytest.raises(ModelLoadError, match="unknown model 'nope'; known real models: "
                                             "smollm2-135m-instruct, gemma-3-270m"):
        zoo.get_real_model("nope")


def _tiny_entry(name: str, sha: str):
    """A registry entry for the tiny GGUF checkpoint (its package does not exist)."""
    from locos_tl.models import zoo

    return zoo.RealModel(name=name, architecture="LlamaForCausalLM", n_layers=2, n_heads=4,
                         n_kv_heads=2, params="0.1M", file_mb=0, quantization="Q8_0",
                         licence="MIT", packages=("no-such-package-locos==0.1",), sha256=sha)


def test_fetch_installs_prepares_and_loads_by_name(tiny_gguf, cache, monkeypatch):
    """`fetch` with pip replaced by a recorder: packages --no-deps, then the checkpoint is
    prepared once; the name then loads offline and provenance names it."""
    import dataclasses
    import hashlib

    from locos_tl.models import zoo
    from locos_tl.runs.provenance import provenance

    sha = hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    entry = _tiny_entry("tiny-test", sha)
    monkeypatch.setitem(zoo.REAL_MODELS, "tiny-test", entry)
    monkeypatch.setitem(zoo._FILES, "tiny-test", lambda: tiny_gguf)
    calls = []
    monkeypatch.setattr(zoo, "pip_install", lambda reqs, no_deps, log: calls.append(
        (reqs, no_deps)))
    assert entry.status() == "no"
    path = zoo.fetch("tiny-test", log=lambda msg: None)
    assert calls == [(["no-such-package-locos==0.1"], True)]
    assert path == cache / "gguf" / sha and entry.prepared and entry.status() == "yes"
    model = load_model("tiny-test", device="cpu")
    source = provenance(model)["model"]["source"]
    assert source["registry_name"] == "tiny-test" and source["sha256"] == sha
    assert source["packages"] == ["no-such-package-locos==0.1"]
    assert "source_removed" not in source  # an installed file, not an assembled copy
    assert zoo.fetch("tiny-test", log=lambda msg: None) == path and len(calls) == 1
    bad = dataclasses.replace(entry, sha256="0" * 64)
    monkeypatch.setitem(zoo.REAL_MODELS, "tiny-test", bad)
    with pytest.raises(ModelLoadError, match="not the expected"):
        zoo.prepare("tiny-test")


def test_provenance_says_when_an_assembled_source_file_was_removed(tiny_gguf, cache,
                                                                   monkeypatch):
    """A GGUF file assembled from chunk packages (Gemma-3-270m) is a copy under the
    cache, deleted once the checkpoint is prepared: provenance keeps its name and hash
    and says the file is gone (``source_removed``; an installed file has no such key:
    ``test_fetch_installs_prepares_and_loads_by_name``)."""
    import hashlib
    import shutil

    from locos_tl.models import zoo
    from locos_tl.models.gguf_cache import cache_root
    from locos_tl.runs.provenance import provenance

    sha = hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    copy = cache_root() / "gguf-files" / "assembled.gguf"
    copy.parent.mkdir(parents=True)
    shutil.copyfile(tiny_gguf, copy)
    entry = _tiny_entry("tiny-chunks", sha)
    monkeypatch.setitem(zoo.REAL_MODELS, "tiny-chunks", entry)
    monkeypatch.setitem(zoo._FILES, "tiny-chunks", lambda: copy)
    zoo.prepare("tiny-chunks")
    assert not copy.exists()
    source = provenance(load_model("tiny-chunks", device="cpu"))["model"]["source"]
    assert source["source_removed"] is True and source["sha256"] == sha
    # a zoo file is named, not located: its path is this machine's cache
    assert source["file_name"] == "assembled.gguf" and "source_file" not in source


def test_models_list_and_fetch_cli(cache, monkeypatch):
    from typer.testing import CliRunner

    from locos_tl.cli import app
    from locos_tl.models import zoo

    entry = zoo.REAL_MODELS["smollm2-135m-instruct"]
    from safetensors.torch import save_file

    fake = cache / "gguf" / entry.sha256  # a prepared directory, as far as status goes
    fake.mkdir(parents=True)
    (fake / "config.json").write_text("{}")
    (fake / "gguf_source.json").write_text("{}")
    save_file({"w": torch.zeros(3)}, fake / "model.safetensors")  # as long as its header
    res = CliRunner().invoke(app, ["models", "list"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split() == ["name", "architecture", "layers", "x", "heads", "(kv)", "size",
                                "licence", "installed"]
    smol = next(x for x in lines if x.startswith("smollm2-135m-instruct"))
    gemma = next(x for x in lines if x.startswith("gemma-3-270m"))
    assert "LlamaForCausalLM" in smol and "30 x 9 (3)" in smol and "Apache-2.0" in smol
    assert smol.rstrip().endswith("yes")
    assert "Gemma3ForCausalLM" in gemma and "18 x 4 (1)" in gemma and "Q4_K_M" in gemma
    assert gemma.rstrip().endswith(("no", "packages only"))
    assert str(cache) in res.output
    res = CliRunner().invoke(app, ["models", "fetch", "nope"])
    assert res.exit_code == 2 and "unknown model 'nope'" in res.output


def test_registry_geometry_checked_before_loading():
    from locos_tl.cli.ablate import checkpoint_dims

    assert checkpoint_dims("smollm2-135m-instruct") == (30, 9)
    assert checkpoint_dims("gemma-3-270m") == (18, 4)
    assert checkpoint_dims("nobody/unknown") is None


def test_models_list_imports_no_heavy_module():
    """`locos models list` answers from the registry and the cache folder alone."""
    import subprocess
    import sys

    code = ("import sys\nfrom locos_tl.cli import app\nsys.argv = ['locos', 'models', 'list']\n"
            "try:\n    app()\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "print(sorted(m for m in ('torch', 'transformers', 'transformer_lens', 'gguf') "
            "if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert "smollm2-135m-instruct" in res.stdout
    assert res.stdout.rstrip().splitlines()[-1] == "[]"
