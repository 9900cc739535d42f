"""Write a Hugging Face checkpoint as a GGUF file the way llama.cpp's
``convert_hf_to_gguf.py`` does, for the GGUF loader's tests.

F32 tensors (no quantization, so the file holds the checkpoint's exact weights), names
from ``gguf``'s tensor map, and the converter's per-architecture changes:

- ``llama``: Q and K rows permuted to llama.cpp's rotary layout; a Llama-3 rope scaling
  (``rope_type: llama3``) stored as the ``rope_freqs`` tensor of per-frequency factors
  (llama.cpp PR #8676), with no rope-scaling metadata;
- ``gemma3``: every norm weight stored as ``1 + w``; a linear rope scaling stored as
  ``gemma3.rope.scaling.type`` / ``.factor``.

``omit`` drops metadata keys an older converter did not write (``head_count_kv``).
The tokenizer is the tests' byte-level BPE (``gpt2`` in GGUF terms).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Q/K row permutation (``LlamaModel.permute``)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama3_rope_factors(cfg: dict) -> np.ndarray:
    """The ``rope_freqs`` tensor llama.cpp writes for a ``llama3`` rope scaling."""
    rope = cfg["rope_parameters"]
    base = rope.get("rope_theta", 10000.0)
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor = rope.get("factor", 8.0)
    low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_gguf(hf_dir: Path, path: Path, *, omit: tuple[str, ...] = ()) -> Path:
    """Write the checkpoint in ``hf_dir`` (Llama or Gemma-3 text) to ``path`` as F32 GGUF."""
    import gguf
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer

    cfg = json.loads((hf_dir / "config.json").read_text())
    arch = {"llama": "llama", "gemma3_text": "gemma3"}[cfg["model_type"]]
    n_layers, n_heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    n_kv = cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_heads
    w = gguf.GGUFWriter(str(path), arch)

    def kv(key: str, add, value) -> None:
        if key not in omit:
            add(value)

    w.add_name(f"tiny {arch}")
    w.add_block_count(n_layers)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_heads)
    kv("head_count_kv", w.add_head_count_kv, n_kv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    rope = cfg.get("rope_parameters") or {}
    if arch == "llama":
        w.add_rope_freq_base(rope.get("rope_theta", 10000.0))
        w.add_rope_dimension_count(head_dim)
    else:
        full = rope.get("full_attention", {})
        w.add_rope_freq_base(full.get("rope_theta", 1e6))
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_sliding_window(cfg["sliding_window"])
        if full.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(full["factor"])

    tok = AutoTokenizer.from_pretrained(hf_dir)
    spec = json.loads(tok.backend_tokenizer.to_str())["model"]
    tokens = [t for t, _ in sorted(spec["vocab"].items(), key=lambda kv: kv[1])]
    tokens += [f"[PAD{i}]" for i in range(cfg["vocab_size"] - len(tokens))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * len(tokens))
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["merges"]])
    w.add_eos_token_id(tok.eos_token_id)
    w.add_add_bos_token(False)

    tmap = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), n_layers)
    for name, a in load_file(hf_dir / "model.safetensors").items():
        a = a.astype(np.float32)
        if arch == "llama" and name.endswith("q_proj.weight"):
            a = _permute(a, n_heads)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            a = _permute(a, n_kv)
        if arch == "gemma3" and name.endswith("norm.weight"):
            a = a + 1
        w.add_tensor(tmap.get_name(name, try_suffixes=(".weight", ".bias")), a)
    if arch == "llama" and rope.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
