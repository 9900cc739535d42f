"""A hand-compiled organism: Qwen3 weights SET BY HAND to implement the circuit.

A companion to the trained organisms: the circuit is exactly the intended one, so
its ground truth is known by construction
(and still checked causally by :mod:`locos_tl.organisms.analysis`).

Residual stream (d_model 256), one direction per feature::

    0        const (1 in every token embedding)
    1..48    NAME identity (one-hot)          49..96   LANDMARK identity
    97..120  CITY identity                    121      Q marker
    122      "is a name or a city" flag       123..170 previous-token NAME (also the
    171      "previous token is name/city"             name answer channel)
    172..255 filler subspace (random unit vectors for every other token)

Heads (all others have zero query and zero output projections: dead):

- ``L0H{PREV}`` previous-token mover: query and key read the constant direction and
  are placed on the four fastest rotary frequencies so that ``q . k`` peaks at relative
  offset -1; its value reads NAME identity (and the name/city flag) and writes them to
  the previous-token NAME channel (and flag).
- ``L1H{LIT}`` literal copy (kv group 0): query = NAME of the question token, key = the
  previous-token NAME channel (so it finds the LANDMARK right after that name), value =
  LANDMARK identity, output -> LANDMARK identity channel (read by the unembedding).
- ``L1H{NONLIT}`` non-literal writer (kv group 1): query = CITY of the question token,
  key = ``city(LANDMARK)`` of each landmark (the hidden map lives in ``k_proj``), value
  = the previous-token NAME channel at that landmark, output -> the NAME answer channel.

Content matching uses only the 16 slowest rotary frequency pairs (rope theta 1e6), on
which rotation over a few hundred positions is < 0.3 rad. The unembedding reads the
LANDMARK channel for landmarks, the previous-token NAME channel for names and the
"previous token is name/city" flag for ``</s>`` (so generation stops after the answer).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from locos_tl.organisms import vocab as V

D_MODEL, N_HEADS, N_KV, D_HEAD, D_MLP = 256, 8, 2, 64, 16
PREV, LIT, NONLIT = 3, 1, 6  # L0H3, L1H1 (kv group 0), L1H6 (kv group 1)
ROPE_THETA = 1e6
GAIN = 4.0  # q_norm / k_norm gain: max attention logit 8 * GAIN**2 = 128

C_CONST, C_NAME, C_LM, C_CITY, C_Q, C_NC, C_PREV, C_FLAG, C_FILL = (
    0, 1, 49, 97, 121, 122, 123, 171, 172)

FAST = list(range(4))  # rotary pairs (i, i + 32) used by the previous-token head
SLOW_DIMS = [*range(16, 32), *range(48, 64)]  # slowest 16 pairs: content matching


def config() -> Any:
    """The ``Qwen3Config`` of the compiled organism."""
    from transformers import Qwen3Config

    t2i = V.token_to_id()
    return Qwen3Config(
        vocab_size=len(t2i), hidden_size=D_MODEL, intermediate_size=D_MLP,
        num_hidden_layers=2, num_attention_heads=N_HEADS, num_key_value_heads=N_KV,
        head_dim=D_HEAD, max_position_embeddings=1024, rope_theta=ROPE_THETA,
        tie_word_embeddings=False, bos_token_id=t2i[V.BOS], eos_token_id=t2i[V.EOS],
        pad_token_id=t2i[V.PAD], rms_norm_eps=1e-6,
    )


def build(seed: int = 0) -> Any:
    """Construct the compiled ``Qwen3ForCausalLM`` (eval mode, float32).

    Args:
        seed: seed of the random filler embeddings and name content vectors.
    """
    from transformers import Qwen3ForCausalLM

    rng = np.random.default_rng(seed)
    cfg = config()
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    t2i = V.token_to_id()
    vocab = V.vocab_list()
    nV = len(vocab)
    name_idx = {n: i for i, n in enumerate(V.NAMES)}
    lm_idx = {n: i for i, n in enumerate(V.LANDMARKS)}
    city_idx = {n: i for i, n in enumerate(V.CITIES)}

    E = np.zeros((nV, D_MODEL))
    E[:, C_CONST] = 1.0
    n_fill = D_MODEL - C_FILL
    for tok, i in t2i.items():
        if tok in name_idx:
            E[i, C_NAME + name_idx[tok]] = 1.0
            E[i, C_NC] = 1.0
        elif tok in lm_idx:
            E[i, C_LM + lm_idx[tok]] = 1.0
        elif tok in city_idx:
            E[i, C_CITY + city_idx[tok]] = 1.0
            E[i, C_NC] = 1.0
        elif tok == V.QMARK:
            E[i, C_Q] = 1.0
        else:
            v = rng.standard_normal(n_fill)
            E[i, C_FILL:] = v / np.linalg.norm(v)

    # content vectors (unit, on the slow rotary dims)
    def unit_rows(n: int, orthonormal: bool) -> np.ndarray:
        if orthonormal:
            q, _ = np.linalg.qr(rng.standard_normal((len(SLOW_DIMS), n)))
            return q.T
        x = rng.standard_normal((n, len(SLOW_DIMS)))
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    name_vec = unit_rows(len(V.NAMES), orthonormal=False)  # 48 in 32 dims
    city_vec = unit_rows(len(V.CITIES), orthonormal=True)  # 24 orthonormal

    sd = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    T = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    sd["model.embed_tokens.weight"] = T(E)
    for l_ in range(2):
        p = f"model.layers.{l_}."
        sd[p + "input_layernorm.weight"] = torch.ones(D_MODEL)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(D_MODEL)
        sd[p + "self_attn.q_norm.weight"] = torch.full((D_HEAD,), GAIN)
        sd[p + "self_attn.k_norm.weight"] = torch.full((D_HEAD,), GAIN)
    sd["model.norm.weight"] = torch.ones(D_MODEL)

    # ---- layer 0: previous-token head --------------------------------------------------
    theta = ROPE_THETA ** (-np.arange(D_HEAD // 2) * 2 / D_HEAD)
    Wq = np.zeros((N_HEADS * D_HEAD, D_MODEL))
    Wk = np.zeros((N_KV * D_HEAD, D_MODEL))
    Wv = np.zeros((N_KV * D_HEAD, D_MODEL))
    Wo = np.zeros((D_MODEL, N_HEADS * D_HEAD))
    g = PREV // (N_HEADS // N_KV)
    for i in FAST:  # q = (1, 0) per pair; k = R(theta_i) q -> q.k peaks at offset -1
        Wq[PREV * D_HEAD + i, C_CONST] = 1.0
        Wk[g * D_HEAD + i, C_CONST] = np.cos(theta[i])
        Wk[g * D_HEAD + i + D_HEAD // 2, C_CONST] = np.sin(theta[i])
    # value: NAME identity (48) and the name/city flag; residual norm at a name token
    # is sqrt(3/256), so scale the write by that to put ~1 in the channel
    s0 = np.sqrt(3 / D_MODEL)
    for j in range(len(V.NAMES)):
        Wv[g * D_HEAD + j, C_NAME + j] = 1.0
        Wo[C_PREV + j, PREV * D_HEAD + j] = s0
    Wv[g * D_HEAD + 48, C_NC] = 1.0
    Wo[C_FLAG, PREV * D_HEAD + 48] = s0
    for k, w in (("q_proj", Wq), ("k_proj", Wk), ("v_proj", Wv), ("o_proj", Wo)):
        sd[f"model.layers.0.self_attn.{k}.weight"] = T(w)

    # ---- layer 1: literal copy (group 0) and non-literal writer (group 1) ----------------
    Wq = np.zeros((N_HEADS * D_HEAD, D_MODEL))
    Wk = np.zeros((N_KV * D_HEAD, D_MODEL))
    Wv = np.zeros((N_KV * D_HEAD, D_MODEL))
    Wo = np.zeros((D_MODEL, N_HEADS * D_HEAD))
    g_lit, g_non = LIT // (N_HEADS // N_KV), NONLIT // (N_HEADS // N_KV)
    assert g_lit != g_non
    s1 = np.sqrt(4 / D_MODEL)  # residual norm at a pair's landmark (const, lm, prev, flag)
    for j in range(len(V.NAMES)):
        for d, c in zip(SLOW_DIMS, name_vec[j], strict=True):
            Wq[LIT * D_HEAD + d, C_NAME + j] = c
            Wk[g_lit * D_HEAD + d, C_PREV + j] = c
        Wv[g_non * D_HEAD + j, C_PREV + j] = 1.0
        Wo[C_PREV + j, NONLIT * D_HEAD + j] = s1
    for j, lm in enumerate(V.LANDMARKS):
        ci = city_idx[V.CITY_OF[lm]]
        for d, c in zip(SLOW_DIMS, city_vec[ci], strict=True):
            Wk[g_non * D_HEAD + d, C_LM + j] = c
        Wv[g_lit * D_HEAD + j, C_LM + j] = 1.0
        Wo[C_LM + j, LIT * D_HEAD + j] = s1
    for ci in range(len(V.CITIES)):
        for d, c in zip(SLOW_DIMS, city_vec[ci], strict=True):
            Wq[NONLIT * D_HEAD + d, C_CITY + ci] = c
    for k, w in (("q_proj", Wq), ("k_proj", Wk), ("v_proj", Wv), ("o_proj", Wo)):
        sd[f"model.layers.1.self_attn.{k}.weight"] = T(w)

    # ---- unembedding --------------------------------------------------------------------
    U = np.zeros((nV, D_MODEL))
    for tok, i in t2i.items():
        if tok in name_idx:
            U[i, C_PREV + name_idx[tok]] = 3.0
        elif tok in lm_idx:
            U[i, C_LM + lm_idx[tok]] = 3.0
    U[t2i[V.EOS], C_FLAG] = 9.0
    sd["lm_head.weight"] = T(U)
    model.load_state_dict(sd)
    model.eval()
    return model


def save_compiled(out_dir: str | Path, seed: int = 0) -> Path:
    """Build and ``save_pretrained`` the compiled organism with its tokenizer.

    Writes ``train_log.json`` with ``{"kind": "compiled", ...}`` for the model card.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = build(seed)
    model.save_pretrained(out, safe_serialization=True)
    V.build_tokenizer().save_pretrained(out)
    rec = {"kind": "compiled", "seed": seed,
           "heads": {"prev_token": [0, PREV], "literal_copy": [1, LIT],
                     "nonliteral_writer": [1, NONLIT]},
           "config": {"seed": seed, "rope_theta": ROPE_THETA, "gain": GAIN}}
    (out / "train_log.json").write_text(json.dumps(rec, indent=1) + "\n")
    return out


def build_compiled_organism(out_dir: str | Path | None = None, seed: int = 0, *,
                            card: bool = True, command: str | None = None) -> Path:
    """Build the compiled organism into ``out_dir`` (default: the shipped
    :data:`~locos_tl.organisms.COMPILED_ORGANISM`) and, with ``card``, establish its heads
    causally and write ``MODEL_CARD.md`` (:mod:`locos_tl.organisms.card`).

    Args:
        out_dir: the output directory (created if missing).
        seed: seed of the random filler embeddings and name content vectors.
        card: write the model card and its detector section (a causal analysis: about a
            minute on one CPU thread).
        command: the command recorded in the card (default: the ``python -m`` form with
            these arguments).

    Returns:
        The output directory.
    """
    from locos_tl.organisms import COMPILED_ORGANISM

    out = save_compiled(COMPILED_ORGANISM if out_dir is None else out_dir, seed=seed)
    if card:
        from locos_tl.organisms.card import write_card, write_card_with_detectors

        if command is None:
            args = ([] if out_dir is None else ["--out", str(out_dir)]) + (
                [] if seed == 0 else ["--seed", str(seed)])
            command = " ".join(["python -m locos_tl.organisms.compiled", *args])
        write_card(out, command=command)
        write_card_with_detectors(out, command=command)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m locos_tl.organisms.compiled [--out DIR] [--seed N] [--no-card]``."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m locos_tl.organisms.compiled",
                                 description="Build the hand-compiled organism.")
    ap.add_argument("--out", default=None, help="output directory (default: the shipped dir)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-card", action="store_true")
    a = ap.parse_args(argv)
    args = sys.argv[1:] if argv is None else argv
    cmd = ("python -m locos_tl.organisms.compiled " + " ".join(args)).strip()
    print(build_compiled_organism(a.out, seed=a.seed, card=not a.no_card,  # noqa: T201
                                  command=cmd))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
