"""Deterministic training of the model organism.

Trains a small ``Qwen3ForCausalLM`` (grouped-query attention) from scratch on the
literal and non-literal retrieval tasks of :mod:`locos_tl.organisms.tasks`, on one CPU
thread, with all randomness derived from one seed; saves the checkpoint and the
word-level tokenizer with ``save_pretrained``.

Loss: cross-entropy only on the answer token and on the ``</s>`` after it.

The presets and the command line are :mod:`locos_tl.organisms.recipes`, which imports
this package (never the other way round); ``python -m locos_tl.organisms.train`` runs
them through this package's ``__main__``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from locos_tl.organisms import vocab as V
from locos_tl.organisms.config_record import changed_fields, describe_changes
from locos_tl.organisms.positions import skip_positions
from locos_tl.organisms.tasks import (
    ContextSpec,
    ids_table,
    induction_batch,
    make_example,
    training_batch,
)

_REPO = Path(__file__).resolve().parents[3]  # locos_tl/organisms/train/ -> the repository


@dataclass
class TrainConfig:
    """Everything that determines a training run (recorded in the model card).

    Attributes:
        seed: master seed (torch init and the data stream ``[seed, 1_000_000]``).
        steps: optimiser steps.
        batch_size: sequences per step.
        lr: AdamW learning rate (the peak one with ``lr_schedule="cosine"``).
        warmup: warmup steps (``lr_schedule="cosine"`` only).
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
        max_position: ``max_position_embeddings`` of the checkpoint.
        virtual_lengths: skip-wise position curriculum ``[(fraction_of_steps_until,
            max_virtual_len), ...]`` (:mod:`~locos_tl.organisms.positions`): each task row's
            position ids span a virtual length drawn uniformly from ``[real, max]``;
            ``None``: consecutive positions.
        init_from: warm start: a checkpoint directory of the same width (e.g. the shipped
            ``retrieval-2l``); ``None``: random init from ``seed``.
        layer_map: with ``init_from``: the source layer of each new layer (``[0, 1, 1]``
            grows 2 layers to 3 by duplicating layer 1; duplicated layers start with their
            ``o_proj`` and ``down_proj`` divided by the number of copies).
        long_every: every ``long_every``-th step trains on real long prompts instead
            (lengths ``long_lengths``, ``long_batch`` rows, consecutive positions); 0: never.
        eval_lengths: prompt lengths of the held-out accuracy printed every ``eval_every``.
        checkpoint_every: steps between resumable checkpoints (``checkpoint.pt`` in the
            output directory: model, optimiser, data stream, history); 0: none.
        p_book: fraction of task rows whose filler is real book text (from ``book_dir``,
            default: the books shipped with locos_tl; the file names are recorded).
        book_dir: directory of ``*.txt`` books for ``p_book``.
        p_needle_first: fraction of task rows whose needle precedes every other entity
            (early needles: the longest retrieval distances; see
            :func:`~locos_tl.organisms.tasks.make_example`).
        rope_theta: RoPE base frequency. Raising it on a warm start is "adjusted base
            frequency" context extension (Xiong et al. 2023, arXiv 2309.16039): slower
            rotations keep more of ``d_head`` usable for matching content far away.
        lr_schedule: ``"constant"`` (``lr`` throughout: how ``retrieval-2l`` was trained)
            or ``"cosine"`` (linear warmup over ``warmup`` steps, cosine decay to 10 %).
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
    max_position: int = 1024
    virtual_lengths: list[tuple[float, int]] | None = None
    init_from: str | None = None
    layer_map: list[int] | None = None
    long_every: int = 0
    long_lengths: tuple[int, int] = (512, 1024)
    long_batch: int = 8
    eval_lengths: tuple[int, ...] = (64, 128)
    checkpoint_every: int = 0
    lr_schedule: str = "constant"
    p_book: float = 0.0
    book_dir: str | None = None
    p_needle_first: float = 0.0
    rope_theta: float = 10000.0


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
        max_position_embeddings=cfg.max_position,
        rope_theta=cfg.rope_theta,
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
                   spec: ContextSpec | None = None, chunk: int = 32) -> dict[str, float]:
    """Greedy next-token accuracy of an HF model on fresh examples, per task.

    Returns:
        ``{"literal": acc, "nonliteral": acc}`` in [0, 1].
    """
    spec = spec or ContextSpec()
    out = {}
    for ti, task in enumerate(("literal", "nonliteral")):
        rng = np.random.default_rng([seed, ti, n_tokens])
        exs = [make_example(rng, n_tokens, task, spec) for _ in range(n)]
        hits = 0
        for i in range(0, n, chunk):
            ids = torch.tensor([e.ids for e in exs[i : i + chunk]])
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, -1]
            ans = torch.tensor([e.answer_id for e in exs[i : i + chunk]])
            hits += int((logits.argmax(-1) == ans).sum())
        out[task] = hits / n
    return out


def _virtual_max(cfg: TrainConfig, step: int) -> int | None:
    if not cfg.virtual_lengths:
        return None
    frac = step / max(cfg.steps, 1)
    for until, hi in cfg.virtual_lengths:
        if frac < until:
            return int(hi)
    return int(cfg.virtual_lengths[-1][1])


def _positions(np_rng: np.random.Generator, ids: np.ndarray, n_task: int, n_prompt: int,
               vmax: int | None) -> np.ndarray:
    """Position ids ``[rows, total]``: skip-wise for every row when ``vmax`` is set."""
    rows, total = ids.shape
    pos = np.broadcast_to(np.arange(total, dtype=np.int64), (rows, total)).copy()
    if vmax is None or vmax <= total:
        return pos
    t = ids_table()
    entity = np.isin(ids, np.concatenate([t.names, t.landmarks]))
    for r in range(rows):
        target = int(np_rng.integers(total, vmax + 1))
        forbidden = np.zeros(total, dtype=bool)
        forbidden[1:] = entity[r, :-1]  # never cut right after an entity token
        last = n_prompt - 2 if r < n_task else None
        pos[r] = skip_positions(np_rng, total, target, forbidden=forbidden, last_boundary=last)
    return pos


def build_model(cfg: TrainConfig) -> Any:
    """The initial ``Qwen3ForCausalLM``: random from ``cfg.seed``, or warm-started.

    Raises:
        ValueError: ``init_from`` has another width/head layout, or ``layer_map`` names a
            layer it does not have.
    """
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(cfg.seed)
    mcfg = model_config(cfg)
    mcfg._attn_implementation = "sdpa"
    model = Qwen3ForCausalLM(mcfg)
    if cfg.init_from is None:
        return model
    init = Path(cfg.init_from)
    if not init.is_absolute() and not init.exists():
        init = _REPO / init  # preset paths are relative to the repository root
    src = Qwen3ForCausalLM.from_pretrained(init)
    sc = src.config
    for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "vocab_size"):
        if getattr(sc, k) != getattr(mcfg, k):
            raise ValueError(f"init_from {cfg.init_from}: {k}={getattr(sc, k)} but the run "
                             f"asks for {getattr(mcfg, k)}")
    lmap = list(cfg.layer_map or range(cfg.n_layers))
    if len(lmap) != cfg.n_layers or not all(0 <= i < sc.num_hidden_layers for i in lmap):
        raise ValueError(f"layer_map {lmap} must list {cfg.n_layers} source layers in "
                         f"0..{sc.num_hidden_layers - 1}")
    model.model.embed_tokens.load_state_dict(src.model.embed_tokens.state_dict())
    model.model.norm.load_state_dict(src.model.norm.state_dict())
    gen = torch.Generator().manual_seed(cfg.seed)
    with torch.no_grad():
        for i, j in enumerate(lmap):
            layer = model.model.layers[i]
            layer.load_state_dict(src.model.layers[j].state_dict())
            copies = lmap.count(j)
            if copies > 1:
                for w in (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight):
                    w.div_(copies)
                    w.add_(torch.randn(w.shape, generator=gen) * 1e-3 * w.std())
    model.tie_weights()
    return model


def _checkpoint_path(out_dir: str | Path | None) -> Path | None:
    return None if out_dir is None else Path(out_dir) / "checkpoint.pt"


def _save_checkpoint(path: Path, cfg: TrainConfig, model: Any, opt: Any, np_rng: Any,
                     step: int, history: list, run_loss: float, seconds: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"config": _jsonable(asdict(cfg)), "model": model.state_dict(),
                "opt": opt.state_dict(), "np_rng": np_rng.bit_generator.state,
                "torch_rng": torch.get_rng_state(), "step": step, "history": history,
                "run_loss": run_loss, "seconds": seconds}, tmp)
    tmp.replace(path)


def train(cfg: TrainConfig, out_dir: str | Path | None = None, log=print) -> dict[str, Any]:
    """Train the organism; optionally save it. Resumes from ``out_dir/checkpoint.pt``.

    Args:
        cfg: run configuration.
        out_dir: directory for ``save_pretrained`` (model, tokenizer, ``train_log.json``)
            and the resumable checkpoint; ``None``: do not save.
        log: callable taking one string (progress lines).

    Returns:
        ``{"model": Qwen3ForCausalLM, "history": [...], "seconds": float, "final": {...}}``.

    Raises:
        ValueError: the checkpoint in ``out_dir`` belongs to another configuration.
    """
    torch.set_num_threads(cfg.threads)
    np_rng = np.random.default_rng([cfg.seed, 1_000_000])
    model = build_model(cfg)
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

    book = None
    if cfg.p_book > 0:
        from locos_tl.organisms.tasks import BookFiller, default_book_dir

        book = BookFiller.from_dir(cfg.book_dir or default_book_dir())
    history: list[dict[str, Any]] = []
    start, run_loss, done_s = 0, 0.0, 0.0
    ckpt = _checkpoint_path(out_dir) if cfg.checkpoint_every else None
    if ckpt is not None and ckpt.is_file():
        st = torch.load(ckpt, weights_only=False)
        if changes := _config_changes(st["config"], cfg):
            raise ValueError(f"{ckpt} was written by another configuration: "
                             f"{describe_changes(changes)}; remove it or train into "
                             "another --out")
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        np_rng.bit_generator.state = st["np_rng"]
        torch.set_rng_state(st["torch_rng"])
        start, history, run_loss, done_s = st["step"], st["history"], st["run_loss"], st["seconds"]
        log(f"resuming from {ckpt} at step {start}")
    t0 = time.time() - done_s
    for step in range(start, cfg.steps):
        if cfg.lr_schedule == "cosine":
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
        long_step = cfg.long_every > 0 and (step + 1) % cfg.long_every == 0
        if long_step:
            lo, hi = cfg.long_lengths
            B = cfg.long_batch
        else:
            lo, hi = _length_range(cfg, step)
            B = cfg.batch_size
        n_tok = int(np_rng.integers(lo, hi + 1))
        ids, pos = training_batch(np_rng, B, n_tok, cfg.spec, cfg.p_literal,
                                  cfg.n_questions, cfg.eos_each, book, cfg.p_book,
                                  cfg.p_needle_first)
        n_aux = int(round(cfg.aux_induction * B))
        if n_aux:
            ids = np.concatenate([ids, induction_batch(np_rng, n_aux, ids.shape[1])])
        vmax = None if long_step else _virtual_max(cfg, step)
        if vmax is not None:
            vmax = min(vmax, cfg.max_position)
        position_ids = _positions(np_rng, ids, B, n_tok, vmax)
        ids_t = torch.from_numpy(ids)
        pos_t = torch.from_numpy(pos)
        hidden = model.model(input_ids=ids_t, attention_mask=torch.ones_like(ids_t),
                             position_ids=torch.from_numpy(position_ids)).last_hidden_state
        # task rows: only the answers and the final </s> are trained
        logits = model.lm_head(hidden[:B, pos_t])
        target = ids_t[:B, pos_t + 1]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        if n_aux:
            # repeat of r starts at position len(r) + 1; its 2nd token is the first
            # one predictable by induction (from position len(r) + 1)
            start_aux = ids.shape[1] // 2 + 1
            aux_logits = model.lm_head(hidden[B:, start_aux:-1])
            aux_t = ids_t[B:, start_aux + 1 :]
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
            rec: dict[str, Any] = {"step": step + 1, "loss": run_loss / cfg.eval_every}
            for n_eval in cfg.eval_lengths:
                rec[f"acc{n_eval}"] = quick_accuracy(model, n_eval, n=128 if n_eval <= 256
                                                     else 64, spec=cfg.spec)
            rec["seconds"] = round(time.time() - t0, 1)
            model.train()
            history.append(rec)
            log(json.dumps(rec))
            run_loss = 0.0
        if ckpt is not None and (step + 1) % cfg.checkpoint_every == 0:
            _save_checkpoint(ckpt, cfg, model, opt, np_rng, step + 1, history, run_loss,
                             time.time() - t0)
    model.eval()
    seconds = time.time() - t0
    final = {f"acc{n_eval}": quick_accuracy(model, n_eval, n=256 if n_eval <= 256 else 128,
                                            seed=7, spec=cfg.spec)
             for n_eval in cfg.eval_lengths}
    result = {"model": model, "history": history, "seconds": seconds, "final": final}
    if out_dir is not None:
        save(model, cfg, out_dir, history=history, seconds=seconds, final=final)
        if ckpt is not None:
            ckpt.unlink(missing_ok=True)  # the run is complete: the checkpoint is spent
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


#: what a run trained with before each later :class:`TrainConfig` field existed, where
#: that is not the field's current default (none so far: each new field's default kept
#: the old behaviour)
PREDATING: dict[str, Any] = {}


def _config_changes(recorded: dict[str, Any], cfg: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """The fields where ``cfg`` differs from a recorded configuration (a field the record
    predates counts as :data:`PREDATING` says, else as its default)."""
    return changed_fields(recorded, _jsonable(asdict(cfg)), _jsonable(asdict(TrainConfig())),
                          PREDATING)


def _same_config(recorded: dict[str, Any], cfg: TrainConfig) -> bool:
    """Whether a recorded configuration is ``cfg`` (:func:`_config_changes` finds none)."""
    return not _config_changes(recorded, cfg)

