"""Elicit non-literal retrieval in a pretrained chat model by fine-tuning only its MLP
blocks on NoLiMa trials with distractor needles, while a KL term to the frozen base keeps
the language model (:mod:`locos_tl.organisms.elicit_keep`). The MLPs are trained either
through LoRA on ``gate_proj``, ``up_proj``, ``down_proj`` (``peft``; the shippable
adapter) or in full (``trainable="mlp"``, a pilot). Embeddings, norms and every attention
weight (``W_Q``, ``W_K``, ``W_V``, ``W_O``) stay the pretrained ones, so each head's QK
and OV circuits do too: fine-tuning enhances circuits that already exist (Prakash et al.
2024, "Fine-Tuning Enhances Existing Mechanisms", ICLR).

The run is deterministic (seeded trials, order, windows and initialisation; no dropout)
and resumable: ``<out>/checkpoint.pt`` (trained weights, optimizer, step, early-stopping
state) is written atomically every ``save_every`` steps, the learning curve is appended
to ``<out>/curve.jsonl``, the best validation state is kept in ``<out>/best.pt``, and the
finished weights go to ``<out>/adapter/`` with provenance in ``<out>/elicit.json``.
Early stopping reads the validation entries only (held out of the training set).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from locos_tl.engine.continuation_tokens import continuation_token_ids, trial_context
from locos_tl.errors import LocosError
from locos_tl.organisms.config_record import describe_changes
from locos_tl.organisms.elicit_config import (  # noqa: F401  (re-exported)
    PREDATING,
    ElicitConfig,
    config_changes,
    same_config,
)
from locos_tl.organisms.elicit_keep import (
    AdapterOff,
    KeepData,
    keep_data,
    keep_validation,
    kl_to_base,
)
from locos_tl.trials import Trial

#: the MLP projections LoRA adapts (Llama / Qwen / Gemma / OLMo naming)
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")


def lr_at(cfg: ElicitConfig, step: int) -> float:
    """Learning rate at ``step`` (0-based): linear warm-up, cosine decay to 10 %."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def answer_ids(tokenizer: Any, trial: Trial) -> list[int]:
    """The answer trained on: the target's name (chat: the assistant turn; completion:
    `` NAME.`` after "The character's name is"), then end of turn. The name's ids are
    those the tokenizer writes right after the trial's prompt, cut from the joint
    encoding (:func:`~locos_tl.engine.continuation_tokens.continuation_token_ids`): a
    SentencePiece-style tokenizer that marks the start of a text writes ``Chiara``
    after ``"<|assistant|>\\n"``, not the ``▁Chiara`` of the name on its own.

    Raises:
        LocosError: the answer tokenizes to nothing.
    """
    text = trial.answer
    if trial.meta.get("template") == "completion":
        text = f" {text}."
    ids = continuation_token_ids(tokenizer, [text], context=trial_context(tokenizer, trial))[0]
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


def freeze_all_but_mlp(model: Any) -> Any:
    """Train every MLP weight of ``model`` and nothing else (``trainable="mlp"``)."""
    for name, p in model.named_parameters():
        p.requires_grad_(".mlp." in name)
    return model


def prepare_trainable(model: Any, cfg: ElicitConfig) -> Any:
    """``model`` ready to train its MLPs as ``cfg.trainable`` says.

    Raises:
        LocosError: an unknown ``trainable``; peft missing for ``"lora"``.
    """
    if cfg.trainable == "lora":
        return add_mlp_lora(model, cfg)
    if cfg.trainable == "mlp":
        return freeze_all_but_mlp(model)
    raise LocosError(f"trainable must be 'lora' or 'mlp', not {cfg.trainable!r}")


def trained_state(model: Any, cfg: ElicitConfig) -> dict[str, torch.Tensor]:
    """The trained weights (LoRA matrices or MLP weights), detached copies."""
    if cfg.trainable == "lora":
        from peft import get_peft_model_state_dict

        return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def load_trained_state(model: Any, state: dict[str, torch.Tensor], cfg: ElicitConfig) -> None:
    if cfg.trainable == "lora":
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, state)
        return
    with torch.no_grad():
        params = dict(model.named_parameters())
        for n, v in state.items():
            params[n].copy_(v)


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
    names the target and the fraction that names a distractor (NoLiMa ``contains``:
    case-sensitive, as the evaluation scores it), and the mean teacher-forced
    cross-entropy of the answer (``{qtype}_ce``, nats per token)."""
    model.eval()
    out: dict[str, float] = {}
    for qtype, ts in trials.items():
        hit = rival = 0
        ce = 0.0
        for t in ts:
            ids = torch.tensor([list(t.tokens)], device=device)
            with _autocast(cfg, device):
                gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                     max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.eos_token_id)
            ce += float(step_loss(model, tokenizer, t, cfg, device))
            text = tokenizer.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)
            hit += t.answer in text  # NoLiMa's contains: a case-sensitive substring
            rival += any(n in text for n in t.meta.get("distractor_names", []))
        out[f"{qtype}_target"] = hit / len(ts)
        out[f"{qtype}_distractor"] = rival / len(ts)
        out[f"{qtype}_ce"] = ce / len(ts)
    model.train()
    return out


def _save_atomic(obj: Any, path: Path) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _append(path: Path, row: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


def validation_score(row: dict[str, float], cfg: ElicitConfig) -> float | None:
    """Early stopping's score of a validation row: ``onehop`` target minus distractor
    rate; ``None`` (not eligible) when held-out perplexity exceeds ``max_ppl_ratio``."""
    if "ppl_ratio" in row and row["ppl_ratio"] > cfg.max_ppl_ratio:
        return None
    if "onehop_target" not in row:
        return None
    return row["onehop_target"] - row.get("onehop_distractor", 0.0)


def _keep_loss(model: Any, keep: KeepData, step: int, cfg: ElicitConfig,
               device: str) -> tuple[torch.Tensor, float, float]:
    text = kl_to_base(model, keep.base, keep.train_window(step), device=device,
                      autocast=cfg.bf16_autocast)
    prompt = kl_to_base(model, keep.base, keep.train_prompt(step), device=device,
                        autocast=cfg.bf16_autocast)
    return keep.weight * (text + prompt), text.item(), prompt.item()


def train_adapter(model: Any, tokenizer: Any, train: Sequence[Trial],
                  val: dict[str, Sequence[Trial]], cfg: ElicitConfig, out: Path, *,
                  device: str = "cpu", keep: KeepData | None = None,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train (or resume) the MLPs of ``model`` (prepared by :func:`prepare_trainable`)
    on ``train``, one trial a step, plus the KL term of ``keep`` when given.

    Every ``val_every`` steps the validation trials are decoded (and ``keep``'s held-out
    text and prompts scored); the best eligible state (:func:`validation_score`) is kept
    in ``out/best.pt`` and loaded into ``model`` at the end. Training stops after
    ``cfg.patience`` validations without a better score.

    Returns:
        ``{"steps", "stopped_at", "best_step", "seconds", "validation"}``: the configured
        steps, the step training ended at, the step of the kept state (``None``: the last
        one), training seconds of this call and the kept state's validation row.

    Raises:
        LocosError: a checkpoint from another configuration is in ``out``.
    """
    from tqdm.auto import tqdm

    out.mkdir(parents=True, exist_ok=True)
    ckpt_path, best_path, curve = out / "checkpoint.pt", out / "best.pt", out / "curve.jsonl"
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    start, stop = 0, {"best": None, "best_step": None, "since": 0, "row": {}}
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=False)
        if changes := config_changes(ckpt["config"], cfg):
            raise LocosError(f"{ckpt_path} was trained with another configuration: "
                             f"{describe_changes(changes)}; "
                             "use another --out or the same options")
        load_trained_state(model, ckpt["adapter"], cfg)
        opt.load_state_dict(ckpt["optimizer"])
        start, stop = ckpt["step"], ckpt.get("stop", stop)
        log(f"resuming at step {start} of {cfg.steps}")
    model.train()
    last_val: dict[str, float] = dict(stop["row"])
    t0, window, kl_window = time.perf_counter(), [], []
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc="elicit")
    done = start
    for step in bar:
        if cfg.patience and stop["since"] >= cfg.patience:
            log(f"early stop at step {done}: no better validation for {cfg.patience} checks")
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(cfg, step)
        loss = step_loss(model, tokenizer, train[step], cfg, device)
        window.append(loss.item())
        if keep is not None and keep.weight > 0:
            kl, kl_text, kl_prompt = _keep_loss(model, keep, step, cfg, device)
            loss = loss + kl
            kl_window.append((kl_text, kl_prompt))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        done = step + 1
        row: dict[str, Any] = {}
        if done % cfg.val_every == 0 or done == cfg.steps:
            model.eval()
            last_val = validate(model, tokenizer, val, cfg, device)
            if keep is not None:
                last_val.update(keep_validation(model, keep, device=device,
                                                autocast=cfg.bf16_autocast))
            model.train()
            row.update(last_val)
            score = validation_score(last_val, cfg)
            if score is not None and (stop["best"] is None or score > stop["best"]):
                stop = {"best": score, "best_step": done, "since": 0, "row": last_val}
                _save_atomic(trained_state(model, cfg), best_path)
            else:
                stop["since"] += 1
        if done % cfg.save_every == 0 or done == cfg.steps or row:
            row = {"step": done, "loss": sum(window) / len(window), "lr": lr_at(cfg, step),
                   "seconds": round(time.perf_counter() - t0, 1), **row}
            if kl_window:
                row["kl_text_train"] = sum(k[0] for k in kl_window) / len(kl_window)
                row["kl_prompts_train"] = sum(k[1] for k in kl_window) / len(kl_window)
            _append(curve, row)
            window, kl_window = [], []
            _save_atomic({"config": cfg.to_dict(), "step": done, "optimizer": opt.state_dict(),
                          "adapter": trained_state(model, cfg), "stop": stop}, ckpt_path)
            bar.set_postfix(loss=f"{row['loss']:.3f}",
                            **{k: f"{v:.2f}" for k, v in last_val.items()})
    if stop["best_step"] is not None and best_path.exists():
        load_trained_state(model, torch.load(best_path, weights_only=False), cfg)
        last_val = dict(stop["row"])
    return {"steps": cfg.steps, "stopped_at": done, "best_step": stop["best_step"],
            "seconds": round(time.perf_counter() - t0, 1), "validation": last_val}


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
        ModelLoadError: the base cannot be found.
        DataFormatError: the needle set or a haystack cannot be read or is too small.
        LocosError: ``out`` holds a run with another configuration.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import locos_tl as lt
    from locos_tl.data.nolima import resolve_template
    from locos_tl.data.prompt import PromptBuilder
    from locos_tl.organisms.elicit_data import run_entries, training_trials, validation_trials

    out = Path(out)
    torch.manual_seed(cfg.seed)
    base_dir = base_directory(cfg.base)
    tok = AutoTokenizer.from_pretrained(base_dir)
    cfg = dataclasses.replace(cfg, template=resolve_template(cfg.template, tok))
    books = [book_file(h) for h in cfg.haystacks]
    hay = lt.load_haystacks(books)
    train_entries, val_entries = run_entries(cfg.needle_set, cfg.n_validation,
                                             by=cfg.validation_split,
                                             val_needle_set=cfg.val_needle_set)
    builder = PromptBuilder(tok)
    log(f"building {cfg.steps} training trials from {len(train_entries)} entries")
    train = training_trials(tok, train_entries, hay, steps=cfg.steps, lengths=cfg.lengths,
                            distractors=cfg.distractors, question_types=cfg.question_types,
                            seed=cfg.seed, builder=builder, template=cfg.template)
    val = validation_trials(tok, val_entries, hay, n=cfg.val_trials, length=cfg.val_length,
                            question_types=cfg.question_types, seed=cfg.seed, builder=builder,
                            template=cfg.template)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).to(device)
    model = prepare_trainable(model, cfg)
    keep = None
    if cfg.kl_weight > 0:
        keep = keep_data(tok, base_dir, books, [book_file(b) for b in cfg.val_books], cfg,
                         out, key=_sha(base_dir / "model.safetensors"), device=device,
                         base=AdapterOff(model) if cfg.trainable == "lora" else None,
                         log=log)
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    what = f"LoRA on {', '.join(MLP_MODULES)}" if cfg.trainable == "lora" else "MLP weights"
    log(f"{what}: {n_train / 1e6:.2f}M trainable parameters")
    result = train_adapter(model, tok, train, val, cfg, out, device=device, keep=keep, log=log)
    adapter = out / "adapter"
    if cfg.trainable == "lora":
        save_lora(model, adapter, str(cfg.base))
    else:
        from safetensors.torch import save_file

        adapter.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in trained_state(model, cfg).items()},
                  adapter / "mlp_weights.safetensors")
    record = {"config": cfg.to_dict(), "base_config_sha256": _sha(base_dir / "config.json"),
              "validation_entries": [e.id for e in val_entries],
              "trainable_parameters": n_train, "torch": torch.__version__,
              "threads": torch.get_num_threads(), **result}
    (out / "elicit.json").write_text(json.dumps(record, indent=1) + "\n")
    return adapter


def book_file(name_or_path: str) -> Path:
    """A shipped book by name (``dracula_part1``; ``everyday_prose``), else a path."""
    from locos_tl.data.haystack import PROSE_HAYSTACK
    from locos_tl.data.packaged import book_names, book_path

    if name_or_path == PROSE_HAYSTACK.stem:
        return PROSE_HAYSTACK
    return book_path(name_or_path) if name_or_path in book_names() else Path(name_or_path)


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_lora(model: Any, adapter: Path, base: str) -> None:
    """Save a peft LoRA model's adapter to ``adapter``, naming its base ``base`` as given
    (a registry name such as ``"gemma-3-270m"``), never the cache directory the base was
    loaded from, so a shipped adapter carries no path of the machine that trained it."""
    model.peft_config["default"].base_model_name_or_path = base
    model.save_pretrained(adapter)
    (Path(adapter) / "README.md").unlink(missing_ok=True)  # peft's empty card template
