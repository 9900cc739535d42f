"""A tiny Llama checkpoint written as a GGUF file (with the ``gguf`` package), for the
loader's tests without the real models.

The layout follows llama.cpp's writer as transformers reads it back: tensor names
``token_embd`` / ``blk.N.attn_q`` / ..., Q and K rows permuted for llama.cpp's rotary
layout, 2-D weights quantized to Q8_0, a GPT-2-style byte-level BPE tokenizer with a
chat template, tied embeddings (no ``output.weight``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

N_LAYERS, D_MODEL, N_HEADS, N_KV, D_FF = 2, 64, 4, 2, 128
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Q/K row permutation (transformers undoes it when reading)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_tiny_gguf(path: Path, seed: int = 0) -> Path:
    """Write a random 2-layer Llama (d_model 64, 4 heads over 2 kv heads) to ``path``."""
    import gguf
    from gguf.quants import quantize

    from locos_tl.models.tiny import byte_bpe_tokenizer

    tok = byte_bpe_tokenizer()
    spec = json.loads(tok.backend_tokenizer.to_str())["model"]
    vocab = sorted(spec["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["merges"]]
    specials = ["<|im_start|>", "<|im_end|>"]
    tokens += specials
    n_vocab = len(tokens)
    eos = tokens.index("<|im_end|>")

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny llama")
    w.add_block_count(N_LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(D_MODEL)
    w.add_feed_forward_length(D_FF)
    w.add_head_count(N_HEADS)
    w.add_head_count_kv(N_KV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(D_MODEL // N_HEADS)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * (n_vocab - 3)
                      + [gguf.TokenType.CONTROL] * 3)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(eos)
    w.add_pad_token_id(eos)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> np.ndarray:  # [out, in] like torch Linear weights
        return (rng.standard_normal((rows, cols)) * 0.3).astype(np.float32)

    def q8(name: str, a: np.ndarray) -> None:
        data = quantize(a, gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    d_head = D_MODEL // N_HEADS
    q8("token_embd.weight", mat(n_vocab, D_MODEL))
    for l in range(N_LAYERS):
        w.add_tensor(f"blk.{l}.attn_norm.weight",
                     (1 + 0.1 * rng.standard_normal(D_MODEL)).astype(np.float32))
        q8(f"blk.{l}.attn_q.weight", _permute(mat(D_MODEL, D_MODEL), N_HEADS))
        q8(f"blk.{l}.attn_k.weight", _permute(mat(N_KV * d_head, D_MODEL), N_KV))
        q8(f"blk.{l}.attn_v.weight", mat(N_KV * d_head, D_MODEL))
        q8(f"blk.{l}.attn_output.weight", mat(D_MODEL, D_MODEL))
        w.add_tensor(f"blk.{l}.ffn_norm.weight",
                     (1 + 0.1 * rng.standard_normal(D_MODEL)).astype(np.float32))
        q8(f"blk.{l}.ffn_gate.weight", mat(D_FF, D_MODEL))
        q8(f"blk.{l}.ffn_up.weight", mat(D_FF, D_MODEL))
        q8(f"blk.{l}.ffn_down.weight", mat(D_MODEL, D_FF))
    w.add_tensor("output_norm.weight", np.ones(D_MODEL, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
