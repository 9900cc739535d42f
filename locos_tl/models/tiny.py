"""Tiny random-init checkpoints of real architectures, for tests and benchmarks.

No weights can be downloaded in CI; these are architecture-faithful stand-ins (GQA,
QK-norm, post-attention norms, sliding windows) saved with ``save_pretrained`` so they
load through the same path as a real model (``locos_tl.load_model(dir)``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

ARCHS = ("qwen3", "gemma3", "olmo2", "llama")
#: per architecture, :func:`make_tiny_checkpoint` overrides giving sliding windows
#: shorter than a test prompt (Qwen3: one sliding layer of window 8; Gemma-3: window 8;
#: OLMo-2 and Llama have none); the tests' shared ``windowed`` fixture.
SHORT_WINDOWS: dict[str, dict[str, Any]] = {
    "qwen3": dict(use_sliding_window=True, sliding_window=8, max_window_layers=1),
    "gemma3": dict(sliding_window=8),
    "olmo2": {},
    "llama": {},
}

_CORPUS = (
    "Actually, Yuki lives next to the Semper Opera House. Which character has been to "
    "Dresden? The answer is Yuki. The quick brown fox jumps over the lazy dog while the "
    "old man reads a book by the window of the little house near the river. "
    "In the evening the children walked to the market and bought bread, apples and milk. "
    "Records were once again broken for greenhouse gas levels and ocean heat. "
)


def byte_bpe_tokenizer(vocab_size: int = 384, text: str | None = None) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` (Qwen/Llama-3 style) trained on
    ``text`` (a small built-in corpus by default); ``<|endoftext|>`` is EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([text or _CORPUS * 4], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )


def tiny_config(arch: str, vocab_size: int, **overrides: Any) -> Any:
    """A small HF config: 2 layers, d_model 64, 4 query heads over 2 kv heads, d_head 16,
    init std 0.3.

    Raises:
        ValueError: unknown architecture.
    """
    import transformers

    common = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        # large init so attention is peaked and contributions are O(0.1-1) logits: a
        # 1e-5 error bound in tests is then meaningful
        initializer_range=0.3,
    )
    if arch != "olmo2":
        common["head_dim"] = 16
    common.update(overrides)
    if arch == "qwen3":
        return transformers.Qwen3Config(tie_word_embeddings=False, **common)
    if arch == "gemma3":
        return transformers.Gemma3TextConfig(**{"sliding_window": 512, **common},
                                             tie_word_embeddings=True)
    if arch == "olmo2":
        return transformers.Olmo2Config(tie_word_embeddings=False, **common)
    if arch == "llama":
        return transformers.LlamaConfig(tie_word_embeddings=False, **common)
    raise ValueError(f"unknown architecture {arch!r}; use one of {ARCHS}")


def make_tiny_checkpoint(
    arch: str, path: str | Path, *, seed: int = 0, tokenizer: Any = None, **overrides: Any
) -> Path:
    """Build a random-init checkpoint of ``arch`` with a tokenizer and save it to ``path``.

    Args:
        arch: one of :data:`ARCHS`.
        path: output directory.
        seed: torch seed of the random init.
        tokenizer: defaults to :func:`byte_bpe_tokenizer`.
        **overrides: config fields (e.g. ``hidden_size=256, num_hidden_layers=4``).

    Returns:
        ``path``.
    """
    from transformers import AutoModelForCausalLM

    tok = tokenizer if tokenizer is not None else byte_bpe_tokenizer()
    cfg = tiny_config(arch, len(tok), **overrides)
    cfg.eos_token_id = tok.eos_token_id
    cfg.pad_token_id = tok.pad_token_id
    cfg.bos_token_id = None
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    path = Path(path)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
