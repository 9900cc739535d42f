"""Elicited models: a zoo base model with a shipped LoRA adapter on its MLPs
(:mod:`locos_tl.organisms.elicit` trains them), merged once into a plain Hugging Face
checkpoint of the base architecture in the cache, so every hook and tool works unchanged.

Merging adds ``(alpha / r) B A`` to each adapted MLP weight (peft's ``merge_and_unload``);
every other tensor (embeddings, norms, ``W_Q``, ``W_K``, ``W_V``, ``W_O``) is the base's,
bit for bit.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from locos_tl.errors import CachePermissionError, LocosError, ModelLoadError
from locos_tl.models.gguf_cache import (
    SOURCE_FILE,
    cache_root,
    entry_lock,
    entry_problems,
    install_entry,
    is_prepared,
    manifest,
    read_source,
    sha256_file,
    temporary_folder,
)
from locos_tl.models.shipped import SHIPPED_DIR as SHIPPED
from locos_tl.models.shipped import shipped_path


@dataclass(frozen=True)
class ElicitedModel:
    """A base model of the zoo plus a LoRA adapter on its MLPs.

    Attributes:
        name: the registry name (``load_model(name)``, ``--model name``).
        base: the zoo name of the base model.
        architecture, n_layers, n_heads, n_kv_heads, params, licence: as the base's.
        notes: what it was trained for.
    """

    name: str
    base: str
    architecture: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    params: str
    licence: str
    notes: str = ""

    @property
    def adapter(self) -> Path:
        """The shipped adapter directory (peft format)."""
        return SHIPPED / self.name / "adapter"

    @property
    def shape(self) -> str:
        return f"{self.n_layers} x {self.n_heads} ({self.n_kv_heads})"

    def adapter_sha256(self) -> str:
        """SHA-256 of the adapter's weights (the cache key).

        Raises:
            ModelLoadError: the adapter is not shipped in this installation.
        """
        weights = shipped_path(self.name, "adapter", "adapter_model.safetensors", root=SHIPPED)
        return sha256_file(weights)

    @property
    def directory(self) -> Path:
        """The merged checkpoint's directory (exists once fetched)."""
        return cache_root() / "elicited" / f"{self.name}-{self.adapter_sha256()[:16]}"

    @property
    def prepared(self) -> bool:
        return is_prepared(self.directory)

    def problems(self, *, verify: bool = False) -> list[str]:
        """What is wrong with the merged checkpoint; empty when healthy."""
        return entry_problems(self.directory, verify=verify)

    def status(self, *, verify: bool = False) -> str:
        """``"yes"``, ``"damaged: ..."``, ``"not readable: ..."`` (another user's entry),
        ``"no"`` (``locos models fetch NAME``) or ``"no adapter"`` (not shipped in this
        installation)."""
        if not (self.adapter / "adapter_model.safetensors").is_file():
            return "no adapter"
        try:
            if self.prepared:
                problems = self.problems(verify=verify)
                return f"damaged: {'; '.join(problems)}" if problems else "yes"
        except CachePermissionError as exc:  # another user's entry: not damaged
            return f"not readable: {exc}"
        return "no"


def merge(entry: ElicitedModel, base_dir: Path, *,
          log: Callable[[str], None] | None = None, repair: bool = False) -> Path:
    """Merge ``entry``'s adapter into the base checkpoint in ``base_dir`` and save it
    (float32 safetensors, the base's tokenizer files, a source record with each file's
    size and SHA-256) in :attr:`ElicitedModel.directory`; idempotent and locked.

    Raises:
        ModelLoadError: the adapter is missing; the merged entry is damaged and
            ``repair`` is off (the message names ``locos models fetch NAME``); ``peft``
            is not installed (the ``elicit`` extra).
        CachePermissionError: the merged entry is another user's and not readable by
            this one, or its lock file not writable (never repaired).
    """
    dest = entry.directory
    say = log or (lambda _msg: None)
    with entry_lock(dest, dest.name, repair=repair, fix=f"locos models fetch {entry.name}",
                    log=say) as build:
        if not build:
            return dest
        say(f"merging the adapter of {entry.name} into {entry.base} (float32)")
        with temporary_folder(dest) as tmp:
            _merged(entry, base_dir).save_pretrained(tmp)
            for f in base_dir.iterdir():
                if f.is_file() and f.name.startswith(("tokenizer", "special_tokens", "chat_t")):
                    shutil.copy2(f, tmp / f.name)
            base_sha = (read_source(base_dir) or {}).get("sha256")
            record = {"elicited": entry.name, "base": entry.base,
                      "base_directory": str(base_dir), "base_sha256": base_sha,
                      "adapter": str(entry.adapter),
                      "adapter_sha256": entry.adapter_sha256(), "files": manifest(tmp)}
            (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=1) + "\n")
            install_entry(tmp, dest)  # shared by the umask
    return dest


def _merged(entry: ElicitedModel, base_dir: Path) -> Any:
    return merged_model(entry.adapter, base_dir, name=entry.name)


def merged_model(adapter: Path, base_dir: Path, *, name: str | None = None) -> Any:
    """The base checkpoint in ``base_dir`` with the LoRA adapter in ``adapter`` merged in
    (peft's ``merge_and_unload``; float32 Hugging Face model).

    Raises:
        ModelLoadError: ``peft`` is not installed (the ``elicit`` extra).
    """
    import torch
    from transformers import AutoModelForCausalLM

    try:
        from peft import PeftModel
    except ImportError as exc:
        raise ModelLoadError(f"{name or str(adapter)!r} needs peft to merge its adapter: "
                             "pip install 'locos_tl[elicit]'") from exc
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    return PeftModel.from_pretrained(model, adapter).merge_and_unload()


def save_merged(adapter: Path, base_dir: Path, dest: Path) -> Path:
    """Merge ``adapter`` into ``base_dir`` and save it with the base's tokenizer files in
    ``dest`` (a candidate adapter, before it is registered); idempotent."""
    if (dest / "config.json").is_file():
        return dest
    with temporary_folder(dest) as tmp:
        merged_model(adapter, base_dir).save_pretrained(tmp)
        for f in base_dir.iterdir():
            if f.is_file() and f.name.startswith(("tokenizer", "special_tokens", "chat_t")):
                shutil.copy2(f, tmp / f.name)
        install_entry(tmp, dest)
    return dest


def cast_adapter(adapter: str | Path, dtype: Any = None) -> Path:
    """Store a LoRA adapter's weights (``adapter_model.safetensors``) in ``dtype`` (a
    ``torch.dtype``; default ``torch.bfloat16``), in place: a rank-32 adapter of SmolLM2
    is 24 MB in float32 and 12 MB in bfloat16. peft loads it into the float32 model
    unchanged otherwise (the values are rounded once; evaluate the cast adapter, not the
    float32 one).

    Raises:
        LocosError: no adapter weights in ``adapter``.
    """
    import os

    import torch
    from safetensors.torch import load_file, save_file

    dtype = torch.bfloat16 if dtype is None else dtype
    path = Path(adapter) / "adapter_model.safetensors"
    if not path.is_file():
        raise LocosError(f"no adapter weights in {adapter} (adapter_model.safetensors)")
    weights = {k: v.to(dtype).contiguous() for k, v in load_file(path).items()}
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    save_file(weights, tmp, metadata={"format": "pt"})
    os.replace(tmp, path)
    return path
