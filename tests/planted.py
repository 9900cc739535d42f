"""A tiny Llama with one hand-planted retrieval head, and trials for it (test helper).

Head ``PLANTED = (1, 2)`` attends from every query to the (single) name token of the
prompt and writes that name's unembedding direction: a literal copy-retrieval head.
Its query reads a constant residual feature, its key a "this token is a name" feature,
both in the rotary pair with the lowest frequency (dims 7 and 15 of the head), so the
match is position-independent; its value copies the name's one-hot code (dims 0..15),
``W_O`` moves the code to dims 48..63, and ``W_U`` reads it there. Without that write
the model says ".". Every other weight
is small random (std 0.02), so the other heads write little.
"""

from __future__ import annotations

from pathlib import Path

import torch

from locos_tl.models.tiny import byte_bpe_tokenizer, tiny_config
from locos_tl.trials import Trial

PLANTED = (1, 2)
NAMES = ("Katie", "Gary", "Megan", "Diana", "Calvin", "Stuart")
_FLAG, _CONST, _COPY = 40, 41, 48
_HAY = ("The quick brown fox jumps over the lazy dog while the old man reads a book by "
        "the window of the little house near the river. In the evening the children "
        "walked to the market and bought bread, apples and milk. ")


def planted_tokenizer():
    corpus = _HAY * 4 + " ".join(f"Actually {n} lives there. {n}" for n in NAMES) * 8
    corpus += "The grass is green. The sky is blue. The sun is yellow. Here we go. " * 4
    return byte_bpe_tokenizer(vocab_size=400, text=corpus)


def name_token(tok, name: str) -> int:
    ids = tok.encode(" " + name, add_special_tokens=False)
    assert len(ids) == 1, f"{name!r} is not one token: {ids}"
    return ids[0]


@torch.no_grad()
def build_planted(path: str | Path, seed: int = 0) -> Path:
    """Save the planted checkpoint (weights + tokenizer) to ``path``."""
    from transformers import AutoModelForCausalLM

    tok = planted_tokenizer()
    cfg = tiny_config("llama", len(tok))
    cfg.eos_token_id = tok.eos_token_id
    cfg.pad_token_id = tok.pad_token_id
    cfg.bos_token_id = None
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    d_head = 16
    g = torch.Generator().manual_seed(seed)
    for w in model.parameters():  # small random init everywhere, norms = 1
        if w.ndim == 2:
            w.copy_(0.02 * torch.randn(w.shape, generator=g))
    E = torch.zeros(len(tok), 64)
    E[:, 16:40] = 0.1 * torch.randn(len(tok), 24, generator=g)
    E[:, _CONST] = 1.0
    W_U = 0.02 * torch.randn(len(tok), 64, generator=g)
    for i, n in enumerate(NAMES):
        t = name_token(tok, n)
        E[t, i] = 1.0
        E[t, _FLAG] = 1.0
        W_U[t, _COPY + i] = 5.0
    W_U[tok.encode(".", add_special_tokens=False)[0], _CONST] = 0.5  # default guess "."
    model.model.embed_tokens.weight.copy_(E)
    model.lm_head.weight.copy_(W_U)
    layer, head = PLANTED
    kv = head // (cfg.num_attention_heads // cfg.num_key_value_heads)
    attn = model.model.layers[layer].self_attn
    q_rows = slice(head * d_head, (head + 1) * d_head)
    kv_rows = slice(kv * d_head, (kv + 1) * d_head)
    attn.q_proj.weight[q_rows] = 0.0
    attn.k_proj.weight[kv_rows] = 0.0
    attn.v_proj.weight[kv_rows] = 0.0
    attn.o_proj.weight[:, q_rows] = 0.0
    attn.q_proj.weight[head * d_head + 7, _CONST] = 1.6
    attn.k_proj.weight[kv * d_head + 7, _FLAG] = 1.6
    for i in range(d_head):
        attn.v_proj.weight[kv * d_head + i, i] = 1.0
        attn.o_proj.weight[_COPY + i, head * d_head + i] = 1.0
    path = Path(path)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def planted_trials(tok, n: int = 4, hay_words: int = 30) -> list[Trial]:
    """``n`` trials: haystack, a needle naming one character, haystack, question."""
    words = _HAY.split()
    out = []
    for i in range(n):
        name = NAMES[i % len(NAMES)]
        a = " ".join(words[(3 * i) % 20 : (3 * i) % 20 + hay_words // 2])
        b = " ".join(words[(5 * i) % 20 : (5 * i) % 20 + hay_words // 2])
        needle = f" Actually {name} lives there."
        prompt = f"{a}.{needle} {b}. Who lives there? Answer:"
        out.append(Trial.from_text(tok, prompt, needle.strip(), name, meta={"i": i}))
    return out
