"""Deterministic training of the model organism (``python -m locos_tl.organisms.train``).

Trains a small ``Qwen3ForCausalLM`` (grouped-query attention) from scratch on the
literal and non-literal retrieval tasks of :mod:`locos_tl.organisms.tasks`, on one CPU
thread, with all randomness derived from one seed; saves the checkpoint and the
word-level tokenizer with ``save_pretrained``.

Loss: cross-entropy only on the answer token and on the ``</s>`` after it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from locos_tl.organisms import vocab as V
from locos_tl.organisms.tasks import ContextSpec, induction_batch, make_example, training_batch


@dataclass
class TrainConfig:
    """Everything that determines a training run (recorded in the model card).

    Attributes:
        seed: master seed (torch init and the data stream ``[seed, 1_000_000]``).
        steps: optimiser steps.
        batch_size: sequences per step.
        lr: peak AdamW learning rate (linear warmup, cosine decay to 10 %).
        warmup: warmup steps.
        weight_decay: AdamW weight decay.
        lengths: curriculum ``[(fraction_of_steps_until, min_len, max_len), ...]``;
            each step draws its prompt length uniformly from the current range.
        p_literal: fraction of literal first questions.
        n_questions: questions per training sequence (first about the needle).
        eos_each: ``</s>`` after every answer (else only after the last one).
        spec: entity counts of a context.
        n_layers, d_model, n_heads, n_kv_heads, d_head, d_mlp: architecture.
        eval_every: steps between held-out evaluations.
        threads: torch CPU threads.
        aux_induction: auxiliary repeated-random-sequence (induction) rows per step, as a
            fraction of ``batch_size`` (loss on the repeated half, weight 1).
        head_l1: group-lasso coefficient on each head's ``o_proj`` column block
            (``sum_h ||W_O[:, h]||_F``); pushes each function onto few heads.
    """

    seed: int = 0
    steps: int = 5000
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 200
    weight_decay: float = 0.01
    lengths: list[tuple[float, int, int]] = field(
        default_factory=lambda: [(0.25, 24, 40), (0.5, 24, 80), (1.0, 40, 128)]
    )
    p_literal: float = 0.3
    n_questions: int = 2
    eos_each: bool = True
    spec: ContextSpec = field(default_factory=ContextSpec)
    n_layers: int = 2
    d_model: int = 128
    n_heads: int = 8
    n_kv_heads: int = 2
    d_head: int = 16
    d_mlp: int = 128
    eval_every: int = 250
    head_l1: float = 0.0
    aux_induction: float = 0.5
    threads: int = 1


def model_config(cfg: TrainConfig) -> Any:
    """The ``transformers.Qwen3Config`` of the organism."""
    from transformers import Qwen3Config

    t2i = V.token_to_id()
    return Qwen3Config(
        vocab_size=len(t2i),
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_mlp,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.d_head,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=t2i[V.BOS],
        eos_token_id=t2i[V.EOS],
        pad_token_id=t2i[V.PAD],
        use_cache=True,
    )


def _length_range(cfg: TrainConfig, step: int) -> tuple[int, int]:
    frac = step / max(cfg.steps, 1)
    for until, lo, hi in cfg.lengths:
        if frac < until:
            return lo, hi
    return cfg.lengths[-1][1], cfg.lengths[-1][2]


@torch.no_grad()
def quick_accuracy(model: Any, n_tokens: int, n: int = 128, seed: int = 99,
                   spec: ContextSpec | None = None) -> dict[str, float]:
    """Greedy next-token accuracy of an HF model on fresh examples, per task.

    Returns:
        ``{"literal": acc, "nonliteral": acc}`` in [0, 1].
    """
    spec = spec or ContextSpec()
    out = {}
    for ti, task in enumerate(("literal", "nonliteral")):
        rng = np.random.default_rng([seed, ti, n_tokens])
        exs = [make_example(rng, n_tokens, task, spec) for _ in range(n)]
        ids = torch.tensor([e.ids for e in exs])
        logits = model(input_ids=ids).logits[:, -1]
        ans = torch.tensor([e.answer_id for e in exs])
        out[task] = float((logits.argmax(-1) == ans).float().mean())
    return out


def train(cfg: TrainConfig, out_dir: str | Path | None = None, log=print) -> dict[str, Any]:
    """Train the organism; optionally save it.

    Args:
        cfg: run configuration.
        out_dir: directory for ``save_pretrained`` (model, tokenizer, ``train_log.json``);
            ``None``: do not save.
        log: callable taking one string (progress lines).

    Returns:
        ``{"model": Qwen3ForCausalLM, "history": [...], "seconds": float, "final": {...}}``.
    """
    from transformers import Qwen3ForCausalLM

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    np_rng = np.random.default_rng([cfg.seed, 1_000_000])
    mcfg = model_config(cfg)
    mcfg._attn_implementation = "sdpa"
    model = Qwen3ForCausalLM(mcfg)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.98),
    )

    def lr_at(step: int) -> float:
        if step < cfg.warmup:
            return cfg.lr * (step + 1) / cfg.warmup
        p = (step - cfg.warmup) / max(cfg.steps - cfg.warmup, 1)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    history: list[dict[str, Any]] = []
    t0 = time.time()
    run_loss = 0.0
    for step in range(cfg.steps):
        lo, hi = _length_range(cfg, step)
        n_tok = int(np_rng.integers(lo, hi + 1))
        ids, pos = training_batch(np_rng, cfg.batch_size, n_tok, cfg.spec, cfg.p_literal,
                                  cfg.n_questions, cfg.eos_each)
        n_aux = int(round(cfg.aux_induction * cfg.batch_size))
        if n_aux:
            ids = np.concatenate([ids, induction_batch(np_rng, n_aux, ids.shape[1])])
        ids_t = torch.from_numpy(ids)
        pos_t = torch.from_numpy(pos)
        B = cfg.batch_size
        hidden = model.model(input_ids=ids_t).last_hidden_state
        # task rows: only the answers and the final </s> are trained
        logits = model.lm_head(hidden[:B, pos_t])
        target = ids_t[:B, pos_t + 1]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        if n_aux:
            # repeat of r starts at position len(r) + 1; its 2nd token is the first
            # one predictable by induction (from position len(r) + 1)
            start = ids.shape[1] // 2 + 1
            aux_logits = model.lm_head(hidden[B:, start:-1])
            aux_t = ids_t[B:, start + 1 :]
            loss = loss + torch.nn.functional.cross_entropy(
                aux_logits.reshape(-1, aux_logits.shape[-1]), aux_t.reshape(-1))
        ce = float(loss.detach())
        if cfg.head_l1 > 0:
            hd = cfg.d_head
            reg = 0.0
            for layer in model.model.layers:
                w = layer.self_attn.o_proj.weight  # [d_model, n_heads * d_head]
                reg = reg + w.view(w.shape[0], -1, hd).pow(2).sum((0, 2)).add(1e-8).sqrt().sum()
            loss = loss + cfg.head_l1 * reg
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        run_loss += ce
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            model.eval()
            acc64 = quick_accuracy(model, 64, spec=cfg.spec)
            acc128 = quick_accuracy(model, 128, spec=cfg.spec)
            model.train()
            rec = {"step": step + 1, "loss": run_loss / cfg.eval_every,
                   "acc64": acc64, "acc128": acc128, "seconds": round(time.time() - t0, 1)}
            history.append(rec)
            log(json.dumps(rec))
            run_loss = 0.0
    model.eval()
    seconds = time.time() - t0
    final = {"acc64": quick_accuracy(model, 64, n=256, seed=7, spec=cfg.spec),
             "acc128": quick_accuracy(model, 128, n=256, seed=7, spec=cfg.spec)}
    result = {"model": model, "history": history, "seconds": seconds, "final": final}
    if out_dir is not None:
        save(model, cfg, out_dir, history=history, seconds=seconds, final=final)
    return result


def save(model: Any, cfg: TrainConfig, out_dir: str | Path, **extra: Any) -> Path:
    """``save_pretrained`` the model (safetensors) and tokenizer, plus ``train_log.json``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.config._attn_implementation = "eager"
    model.save_pretrained(out, safe_serialization=True)
    V.build_tokenizer().save_pretrained(out)
    rec = {"config": _jsonable(asdict(cfg)), **_jsonable(extra)}
    (out / "train_log.json").write_text(json.dumps(rec, indent=1) + "\n")
    return out


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return x


def parse_args(argv: list[str] | None = None) -> tuple[TrainConfig, argparse.Namespace]:
    """Command-line flags -> :class:`TrainConfig` (defaults = the shipped organism)."""
    d = TrainConfig()
    ap = argparse.ArgumentParser(prog="python -m locos_tl.organisms.train",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="output directory (default: the shipped dir)")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--steps", type=int, default=d.steps)
    ap.add_argument("--batch-size", type=int, default=d.batch_size)
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--n-layers", type=int, default=d.n_layers)
    ap.add_argument("--n-kv-heads", type=int, default=d.n_kv_heads)
    ap.add_argument("--d-head", type=int, default=d.d_head)
    ap.add_argument("--d-mlp", type=int, default=d.d_mlp)
    ap.add_argument("--eos-each", action=argparse.BooleanOptionalAction, default=d.eos_each)
    ap.add_argument("--p-literal", type=float, default=d.p_literal)
    ap.add_argument("--aux-induction", type=float, default=d.aux_induction)
    ap.add_argument("--head-l1", type=float, default=d.head_l1)
    ap.add_argument("--eval-every", type=int, default=d.eval_every)
    ap.add_argument("--no-card", action="store_true", help="skip the causal analysis + card")
    a = ap.parse_args(argv)
    cfg = TrainConfig(seed=a.seed, steps=a.steps, batch_size=a.batch_size, lr=a.lr,
                      n_layers=a.n_layers, n_kv_heads=a.n_kv_heads, d_head=a.d_head,
                      d_mlp=a.d_mlp, eval_every=a.eval_every, head_l1=a.head_l1,
                      aux_induction=a.aux_induction, p_literal=a.p_literal,
                      eos_each=a.eos_each)
    return cfg, a


def main(argv: list[str] | None = None) -> int:
    """Entry point: train, save, then (unless ``--no-card``) analyse and write the card."""
    cfg, a = parse_args(argv)
    from locos_tl.organisms import DEFAULT_ORGANISM

    out = Path(a.out) if a.out else Path(DEFAULT_ORGANISM)
    command = "python -m locos_tl.organisms.train " + " ".join(
        sys.argv[1:] if argv is None else argv)
    res = train(cfg, out, log=lambda s: print(s, flush=True))  # noqa: T201
    print(f"trained in {res['seconds']:.0f} s; final {res['final']}", flush=True)  # noqa: T201
    if not a.no_card:
        from locos_tl.organisms.card import write_card, write_card_with_detectors

        write_card(out, command=command.strip(), train_seconds=res["seconds"])
        write_card_with_detectors(out, command=command.strip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
