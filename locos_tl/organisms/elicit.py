"""Elicit non-literal retrieval in a pretrained chat model by fine-tuning only its MLP
blocks (LoRA on ``gate_proj``, ``up_proj``, ``down_proj``; ``peft``) on NoLiMa trials
with distractor needles. Embeddings, norms and every attention weight (``W_Q``, ``W_K``,
``W_V``, ``W_O``) stay the pretrained ones, so each head's QK and OV circuits do too:
fine-tuning enhances circuits that already exist (Prakash et al. 2024, "Fine-Tuning
Enhances Existing Mechanisms", ICLR).

The run is deterministic (seeded trials, order and initialisation; no dropout) and
resumable: ``<out>/checkpoint.pt`` (adapter, optimizer, step) is written atomically every
``save_every`` steps, the learning curve is appended to ``<out>/curve.jsonl``, and the
finished adapter goes to ``<out>/adapter/`` with provenance in ``<out>/elicit.json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from locos_tl.errors import LocosError
from locos_tl.trials import Trial

#: the MLP projections LoRA adapts (Llama / Qwen / Gemma / OLMo naming)
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ElicitConfig:
    """Everything a run depends on (recorded in ``elicit.json``; a resumed run must match).

    Attributes:
        base: a zoo name or checkpoint directory (the pretrained model).
        needle_set: training needle set (shipped name or file); never the evaluation set.
        haystacks: training books: names of books shipped with locos_tl
            (:func:`locos_tl.data.packaged.book_names`) or paths of text files.
        steps: optimizer steps (one trial each, batch 1).
        lr: peak AdamW learning rate (linear warm-up, cosine decay to 10 %).
        warmup: warm-up steps.
        rank, alpha: LoRA rank and scale (``alpha / rank`` multiplies ``B A``).
        lengths: prompt lengths in tokens (chat template included).
        distractors: distractor needles a trial (equal shares).
        question_types: NoLiMa question types (equal shares).
        n_validation: entries held out of training to validate on.
        val_trials, val_length, val_every: validation trials per question type, their
            length, and how often (steps) they are decoded.
        save_every: checkpoint interval (steps).
        seed: trials, order and LoRA initialisation.
        bf16_autocast: run forward and backward under CPU/GPU bfloat16 autocast (the
            adapter's weights and the optimizer stay float32).
    """

    base: str = "smollm2-135m-instruct"
    needle_set: str = "everyday_train"
    haystacks: tuple[str, ...] = ("dracula_part1",)
    steps: int = 2400
    lr: float = 2e-4
    warmup: int = 50
    rank: int = 16
    alpha: int = 32
    lengths: tuple[int, ...] = (500, 750, 1000)
    distractors: tuple[int, ...] = (1, 2, 3)
    question_types: tuple[str, ...] = ("onehop", "direct")
    n_validation: int = 10
    val_trials: int = 24
    val_length: int = 1000
    val_every: int = 400
    save_every: int = 25
    seed: int = 0
    bf16_autocast: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v
                for k, v in dataclasses.asdict(self).items()}


def lr_at(cfg: ElicitConfig, step: int) -> float:
    """Learning rate at ``step`` (0-based): linear warm-up, cosine decay to 10 %."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def answer_ids(tokenizer: Any, trial: Trial) -> list[int]:
    """The assistant turn trained on: the target's name, then end of turn."""
    ids = tokenizer(trial.answer, add_special_tokens=False)["input_ids"]
    if not ids:
        raise LocosError(f"answer {trial.answer!r} tokenizes to nothing")
    return [*ids, tokenizer.eos_token_id]


def add_mlp_lora(model: Any, cfg: ElicitConfig) -> Any:
    """Wrap a Hugging Face causal LM with LoRA on its MLP projections only (peft freezes
    every other weight).

    Raises:
        LocosError: peft is not installed (the ``elicit`` extra).
    """
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise LocosError("elicit needs peft: pip install 'locos_tl[elicit]'") from exc
    torch.manual_seed(cfg.seed)
    lora = LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=0.0,
                      target_modules=list(MLP_MODULES), bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def _autocast(cfg: ElicitConfig, device: str) -> Any:
    return torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16,
                          enabled=cfg.bf16_autocast)


def step_loss(model: Any, tokenizer: Any, trial: Trial, cfg: ElicitConfig,
              device: str) -> torch.Tensor:
    """Cross-entropy (nats per answer token) of the answer after the prompt."""
    ans = answer_ids(tokenizer, trial)
    ids = torch.tensor([[*trial.tokens, *ans]], device=device)
    with _autocast(cfg, device):
        logits = model(input_ids=ids, logits_to_keep=len(ans) + 1).logits[0, :-1]
    return torch.nn.functional.cross_entropy(logits.float(), ids[0, -len(ans):])


@torch.no_grad()
def validate(model: Any, tokenizer: Any, trials: dict[str, Sequence[Trial]],
             cfg: ElicitConfig, device: str, max_new_tokens: int = 8) -> dict[str, float]:
    """Greedy answers on the validation trials: per question type the fraction that
    names the target (NoLiMa ``contains``) and the fraction that names a distractor."""
    model.eval()
    out: dict[str, float] = {}
    for qtype, ts in trials.items():
        hit = rival = 0
        for t in ts:
            ids = torch.tensor([list(t.tokens)], device=device)
            with _autocast(cfg, device):
                gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                     max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.eos_token_id)
            text = tokenizer.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)
            hit += t.answer in text
            rival += any(n in text for n in t.meta.get("distractor_names", []))
        out[f"{qtype}_target"] = hit / len(ts)
        out[f"{qtype}_distractor"] = rival / len(ts)
    model.train()
    return out


def _save_atomic(obj: Any, path: Path) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _append(path: Path, row: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


def train_adapter(model: Any, tokenizer: Any, train: Sequence[Trial],
                  val: dict[str, Sequence[Trial]], cfg: ElicitConfig, out: Path, *,
                  device: str = "cpu", log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train (or resume) the MLP LoRA adapter of ``model`` (already wrapped by
    :func:`add_mlp_lora`) on ``train``, one trial a step.

    Returns:
        ``{"steps", "seconds", "validation"}``: steps done, training seconds of this call
        and the last validation.

    Raises:
        LocosError: a checkpoint from another configuration is in ``out``.
    """
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from tqdm.auto import tqdm

    out.mkdir(parents=True, exist_ok=True)
    ckpt_path, curve = out / "checkpoint.pt", out / "curve.jsonl"
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    start = 0
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=False)
        if ckpt["config"] != cfg.to_dict():
            raise LocosError(f"{ckpt_path} was trained with another configuration; use "
                             "another --out or the same options")
        set_peft_model_state_dict(model, ckpt["adapter"])
        opt.load_state_dict(ckpt["optimizer"])
        start = ckpt["step"]
        log(f"resuming at step {start} of {cfg.steps}")
    model.train()
    last_val: dict[str, float] = {}
    t0, window = time.perf_counter(), []
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc="elicit")
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(cfg, step)
        loss = step_loss(model, tokenizer, train[step], cfg, device)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        window.append(loss.item())
        done = step + 1
        row: dict[str, Any] = {}
        if done % cfg.val_every == 0 or done == cfg.steps:
            last_val = validate(model, tokenizer, val, cfg, device)
            row.update(last_val)
        if done % cfg.save_every == 0 or done == cfg.steps or row:
            row = {"step": done, "loss": sum(window) / len(window), "lr": lr_at(cfg, step),
                   "seconds": round(time.perf_counter() - t0, 1), **row}
            _append(curve, row)
            window = []
            _save_atomic({"config": cfg.to_dict(), "step": done, "optimizer": opt.state_dict(),
                          "adapter": get_peft_model_state_dict(model)}, ckpt_path)
            bar.set_postfix(loss=f"{row['loss']:.3f}",
                            **{k: f"{v:.2f}" for k, v in last_val.items()})
    return {"steps": cfg.steps, "seconds": round(time.perf_counter() - t0, 1),
            "validation": last_val}


def base_directory(base: str) -> Path:
    """The local Hugging Face directory of ``base`` (a zoo name, GGUF file or directory).

    Raises:
        ModelLoadError: see :func:`locos_tl.models.zoo.resolve_checkpoint`; a name that
            is neither (hub names need a local copy: ``hf download``).
    """
    from locos_tl.errors import ModelLoadError
    from locos_tl.models.zoo import resolve_checkpoint

    local = resolve_checkpoint(base)
    path = Path(local if local is not None else base).expanduser()
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"elicit needs a local base model; {base!r} is neither a known "
                             "model, a GGUF file nor a directory with config.json")
    return path


def elicit(cfg: ElicitConfig, out: str | os.PathLike[str], *, device: str = "cpu",
           log: Callable[[str], None] = print) -> Path:
    """Fine-tune ``cfg.base``'s MLPs (LoRA) on distractor trials; resumable.

    Writes ``<out>/adapter/`` (peft's ``adapter_config.json`` and
    ``adapter_model.safetensors``, float32), ``<out>/curve.jsonl`` (loss, learning rate,
    validation fractions) and ``<out>/elicit.json`` (configuration, base checkpoint,
    validation entries, timings).

    Returns:
        The adapter directory.

    Raises:
        ModelLoadError: the base cannot be found; DataFormatError: the needle set or a
        haystack cannot be read or is too small; LocosError: ``out`` holds a run with
        another configuration.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import locos_tl as lt
    from locos_tl.data.prompt import PromptBuilder
    from locos_tl.organisms.elicit_data import split_entries, training_trials, validation_trials

    out = Path(out)
    torch.manual_seed(cfg.seed)
    base_dir = base_directory(cfg.base)
    tok = AutoTokenizer.from_pretrained(base_dir)
    hay = lt.load_haystacks([_book(h) for h in cfg.haystacks])
    train_entries, val_entries = split_entries(lt.load_needle_set(cfg.needle_set),
                                               cfg.n_validation)
    builder = PromptBuilder(tok)
    log(f"building {cfg.steps} training trials from {len(train_entries)} entries")
    train = training_trials(tok, train_entries, hay, steps=cfg.steps, lengths=cfg.lengths,
                            distractors=cfg.distractors, question_types=cfg.question_types,
                            seed=cfg.seed, builder=builder)
    val = validation_trials(tok, val_entries, hay, n=cfg.val_trials, length=cfg.val_length,
                            question_types=cfg.question_types, seed=cfg.seed, builder=builder)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).to(device)
    model = add_mlp_lora(model, cfg)
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log(f"LoRA on {', '.join(MLP_MODULES)}: {n_train / 1e6:.2f}M trainable parameters")
    result = train_adapter(model, tok, train, val, cfg, out, device=device, log=log)
    adapter = out / "adapter"
    model.save_pretrained(adapter)
    (adapter / "README.md").unlink(missing_ok=True)  # peft's empty card template
    record = {"config": cfg.to_dict(), "base_directory": str(base_dir),
              "base_config_sha256": _sha(base_dir / "config.json"),
              "validation_entries": [e.id for e in val_entries],
              "trainable_parameters": n_train, "torch": torch.__version__,
              "threads": torch.get_num_threads(), **result}
    (out / "elicit.json").write_text(json.dumps(record, indent=1) + "\n")
    return adapter


def _book(name_or_path: str) -> Path:
    """A shipped book by name (``dracula_part1``), else a path."""
    from locos_tl.data.packaged import book_names, book_path

    return book_path(name_or_path) if name_or_path in book_names() else Path(name_or_path)


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()
