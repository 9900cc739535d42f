"""GGUF checkpoints as cached Hugging Face directories.

A GGUF file (llama.cpp's format, often 4-bit quantized) is read by transformers
(``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)``, which needs the ``gguf``
package: ``pip install 'locos_tl[gguf]'``) and dequantized to float32. That takes 15-60 s
on a CPU, so it is done once: the float32 weights, config and tokenizer (with its chat
template) are saved as a safetensors directory under the cache root, keyed by the file's
SHA-256, and every later load reads that directory like any local checkpoint.

Cache root: ``$LOCOS_CACHE``, else ``~/.cache/locos_tl``; a prepared checkpoint lives in
``<root>/gguf/<sha256>/`` with ``gguf_source.json`` (source file, SHA-256, quantization
type), which :func:`locos_tl.provenance.provenance` records.

Only the standard library is imported at module level.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from locos_tl.errors import ModelLoadError

SOURCE_FILE = "gguf_source.json"
GGUF_MAGIC = b"GGUF"
_WEIGHTS = "model.safetensors"


def cache_root() -> Path:
    """The cache root: ``$LOCOS_CACHE`` if set, else ``~/.cache/locos_tl``."""
    env = os.environ.get("LOCOS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "locos_tl"


def is_gguf_file(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a file that starts with the GGUF magic bytes."""
    p = Path(path)
    if not p.is_file():
        return False
    with p.open("rb") as f:
        return f.read(4) == GGUF_MAGIC


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 22) -> str:
    """Hex SHA-256 of a file, read in 4 MiB chunks (about 0.3 s per 100 MB here)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def cached_dir(sha256: str) -> Path:
    """Where the checkpoint prepared from the GGUF file with this SHA-256 lives."""
    return cache_root() / "gguf" / sha256


def is_prepared(directory: str | os.PathLike[str]) -> bool:
    """True when ``directory`` holds a finished prepared checkpoint (its source record
    and config; a preparation is written to a temporary folder and renamed into place)."""
    d = Path(directory)
    return (d / SOURCE_FILE).is_file() and (d / "config.json").is_file()


def read_source(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ``gguf_source.json`` record of a prepared directory, or None when it has none."""
    path = Path(directory) / SOURCE_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def quantization_type(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The file's quantization: ``{"file_type": "Q4_1", "tensor_types": {"Q4_1": 210,
    "F32": 61, ...}, "architecture": "llama"}`` read from the GGUF header (``gguf``).

    Raises:
        ModelLoadError: the ``gguf`` package is missing.
    """
    gguf = _require_gguf()
    reader = gguf.GGUFReader(str(path))
    counts: dict[str, int] = {}
    for t in reader.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    out: dict[str, Any] = {"tensor_types": counts}
    field = reader.fields.get("general.file_type")
    if field is not None:
        try:
            name = gguf.LlamaFileType(int(field.contents())).name
            out["file_type"] = name.removeprefix("MOSTLY_")
        except (ValueError, TypeError):
            out["file_type"] = str(field.contents())
    arch = reader.fields.get("general.architecture")
    if arch is not None:
        out["architecture"] = str(arch.contents())
    return out


def _require_gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise ModelLoadError(
            "reading GGUF files needs the `gguf` package: pip install 'locos_tl[gguf]' "
            "(or pip install 'gguf>=0.10')"
        ) from None
    return gguf


def prepare_gguf(
    path: str | os.PathLike[str],
    *,
    sha256: str | None = None,
    registry_name: str | None = None,
    extra: dict[str, Any] | None = None,
    log: Callable[[str], None] | None = None,
) -> Path:
    """The cached Hugging Face directory of a GGUF file, made on first use.

    The first call dequantizes the file with transformers (float32), rebuilds the model
    from its config without the GGUF quantization config (a model loaded from GGUF
    cannot ``save_pretrained`` as it is), checks that the input and output embeddings
    are still tied where the config ties them, and saves weights (safetensors), config
    and tokenizer (chat template included) into a temporary folder that is renamed into
    place with its ``gguf_source.json``. Later calls return the directory at once.

    Args:
        path: the ``.gguf`` file.
        sha256: its SHA-256 when already known (skips hashing).
        registry_name: the :mod:`locos_tl.zoo` name it was fetched as (recorded).
        extra: more fields for ``gguf_source.json`` (e.g. the packages it came from).
        log: called with progress messages (default: silent).

    Returns:
        ``<cache root>/gguf/<sha256>/``.

    Raises:
        ModelLoadError: not a GGUF file; ``gguf`` not installed; transformers cannot
            read the file (unsupported architecture or quantization).
    """
    src = Path(path).expanduser().resolve()
    if not src.is_file():
        raise ModelLoadError(f"GGUF file {str(path)!r} does not exist")
    if not is_gguf_file(src):
        raise ModelLoadError(f"{str(path)!r} is not a GGUF file (no GGUF magic bytes)")
    digest = sha256 or sha256_file(src)
    out = cached_dir(digest)
    if is_prepared(out):
        return out
    say = log or (lambda _msg: None)
    quant = quantization_type(src)
    say(f"dequantizing {src.name} ({quant.get('file_type', '?')}, "
        f"{src.stat().st_size / 1e6:.0f} MB) to float32; once, cached in {out}")
    tmp = out.with_name(f"{digest}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        info = _convert(src, tmp)
        record = {
            "source_file": str(src),
            "file_name": src.name,
            "sha256": digest,
            "size_bytes": src.stat().st_size,
            "quantization": quant.get("file_type"),
            "tensor_types": quant.get("tensor_types"),
            "gguf_architecture": quant.get("architecture"),
            "dtype": "float32",
            "registry_name": registry_name,
            **info,
            **(extra or {}),
        }
        (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=1) + "\n")
        if is_prepared(out):  # another process finished first: keep its directory
            shutil.rmtree(tmp)
            return out
        if out.exists():  # left by an interrupted earlier preparation
            shutil.rmtree(out)
        tmp.rename(out)  # atomic: a directory under the key is always complete
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"prepared {out}")
    return out


def _convert(src: Path, dest: Path) -> dict[str, Any]:
    """Dequantize ``src`` with transformers and save it as a float32 HF directory."""
    _require_gguf()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from locos_tl.models import _quiet

    folder, name = str(src.parent), src.name
    try:
        with _quiet():
            tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                          dtype=torch.float32)
    except (OSError, ValueError, KeyError, NotImplementedError, RuntimeError) as exc:
        raise ModelLoadError(f"transformers cannot read the GGUF file {src}: {exc}") from exc
    cfg_dict = loaded.config.to_dict()
    cfg_dict.pop("quantization_config", None)
    cfg_dict.pop("_name_or_path", None)
    config = type(loaded.config).from_dict(cfg_dict)
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = loaded.state_dict()
    missing, unexpected = plain.load_state_dict(state, strict=False, assign=True)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    if tied:
        plain.tie_weights()
    missing = [k for k in missing if not (tied and k.endswith("lm_head.weight"))]
    if missing or unexpected:
        raise ModelLoadError(f"rebuilding {src.name} without its GGUF quantization config "
                             f"left weights out: missing {missing[:5]}, unexpected "
                             f"{unexpected[:5]}")
    out_emb, in_emb = plain.get_output_embeddings(), plain.get_input_embeddings()
    if tied and out_emb.weight.data_ptr() != in_emb.weight.data_ptr():
        raise ModelLoadError(f"{src.name}: the config ties the embeddings but the rebuilt "
                             "model does not")
    dest.mkdir(parents=True)
    plain.save_pretrained(dest)
    tok.save_pretrained(dest)
    return {
        "architecture": type(plain).__name__,
        "tied_embeddings": tied,
        "chat_template": bool(getattr(tok, "chat_template", None)),
        "n_parameters": int(sum(p.numel() for p in plain.parameters())),
    }
