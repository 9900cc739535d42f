"""GGUF checkpoints as cached Hugging Face directories.

A GGUF file (llama.cpp's format, often 4-bit quantized) is read by transformers
(``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)``, which needs the ``gguf``
package: ``pip install 'locos_tl[gguf]'``) and dequantized to float32. That takes 15-60 s
on a CPU, so it is done once: the float32 weights, config and tokenizer (with its chat
template) are saved as a safetensors directory under the cache root, keyed by the file's
SHA-256, and every later load reads that directory like any local checkpoint.

Cache root: ``$LOCOS_CACHE``, else ``~/.cache/locos_tl``; a prepared checkpoint lives in
``<root>/gguf/<sha256>/`` with ``gguf_source.json`` (source file, SHA-256, quantization
type), which :func:`locos_tl.runs.provenance.provenance` records.

One cache may serve several users (a shared disk, a container built as one user and run
as another): an entry's files and folders are made readable as the preparing user's
umask allows (``0o666 & ~umask``, folders ``0o777 & ~umask``; safetensors itself writes
its weights file ``0o600``), and a file another user's entry does not let this one read
is reported as such (:class:`~locos_tl.errors.CachePermissionError`, naming the file,
its owner and the fix), never as damage to repair (:mod:`locos_tl.models.cache_access`).
A preparation holds a lock on its temporary folder for its whole life
(``<root>/locks/``), so a temporary folder is removed as abandoned only when its lock is
free: safe when several hosts or containers share the cache, where process ids say
nothing (:mod:`locos_tl.models.cache_temp`). This module re-exports both modules'
public names.

Only the standard library is imported at module level.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from locos_tl.errors import ModelLoadError
from locos_tl.models.cache_access import (
    cache_root,
    current_umask,
    grant_read,
    permission_error,
    share_by_umask,
)
from locos_tl.models.cache_temp import (
    _lock,
    install_entry,
    remove_stale_temporaries,
    temporary_folder,
)
from locos_tl.models.gguf_checks import Plan, read_header, reconcile, unpermute_qk
from locos_tl.models.gguf_checks import require_gguf as _require_gguf

#: public names, the cache's file modes (:mod:`locos_tl.models.cache_access`) and
#: temporary folders (:mod:`locos_tl.models.cache_temp`) included
__all__ = [
    "GGUF_MAGIC", "SOURCE_FILE", "cache_root", "cached_dir", "check_file", "current_umask",
    "damaged_error", "entry_lock", "entry_problems", "grant_read", "install_entry",
    "is_gguf_file", "is_prepared", "manifest", "permission_error", "prepare_gguf",
    "quantization_type", "read_source", "remove_stale_temporaries", "sha256_file",
    "share_by_umask", "temporary_folder",
]

SOURCE_FILE = "gguf_source.json"
GGUF_MAGIC = b"GGUF"
_WEIGHTS = "model.safetensors"


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
    and config; a preparation is written to a temporary folder and renamed into place).
    Says nothing of its health: :func:`entry_problems`.

    Raises:
        CachePermissionError: the folder belongs to another user and this one may not
            look into it.
    """
    d = Path(directory)
    try:
        return (d / SOURCE_FILE).is_file() and (d / "config.json").is_file()
    except PermissionError as exc:
        raise permission_error(Path(exc.filename or d), d) from None


def _safetensors_size(path: Path) -> int | None:
    """The size a safetensors file's own header implies (8 + header + data), or None
    when the header cannot be read (a ``PermissionError`` is raised, not taken for
    damage)."""
    try:
        with path.open("rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 0 < n < 1 << 30:
                return None
            header = json.loads(f.read(n))
    except PermissionError:
        raise
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    return 8 + n + max(ends, default=0)


def entry_problems(directory: str | os.PathLike[str], *, verify: bool = False) -> list[str]:
    """What is wrong with a prepared checkpoint directory; empty when it is healthy.

    Cheap checks (sizes): every file the preparation recorded in ``gguf_source.json``
    (``files``: size and SHA-256 of each written file) exists with its size, and every
    safetensors file is as long as its own header says (also for entries prepared
    before sizes were recorded). ``verify`` also hashes every recorded file.

    Returns:
        One line per problem (``"model.safetensors: 2.0 MB, expected 538.2 MB"``); an
        unfinished or missing directory gives ``["not prepared"]``.

    Raises:
        CachePermissionError: a file of the entry belongs to another user and this one
            may not read it (a permission problem, not damage: nothing is repaired).
    """
    d = Path(directory)
    try:
        return _entry_problems(d, verify)
    except PermissionError as exc:
        raise permission_error(Path(exc.filename or d), d) from None


def _entry_problems(d: Path, verify: bool) -> list[str]:
    if not is_prepared(d):
        return ["not prepared"]
    record = read_source(d)
    if record is None:
        return [f"{SOURCE_FILE}: unreadable"]
    problems: list[str] = []
    files: dict[str, dict[str, Any]] = record.get("files") or {}
    for name, want in files.items():
        path = d / name
        if not path.is_file():
            problems.append(f"{name}: missing")
            continue
        size = path.stat().st_size
        if size != want["size"]:
            problems.append(f"{name}: {size / 1e6:.1f} MB, expected {want['size'] / 1e6:.1f} MB")
        elif verify and sha256_file(path) != want["sha256"]:
            problems.append(f"{name}: SHA-256 differs from the one recorded when prepared")
    for path in sorted(d.glob("*.safetensors")):
        if path.name in files and any(p.startswith(path.name + ":") for p in problems):
            continue
        implied = _safetensors_size(path)
        if implied is None:
            problems.append(f"{path.name}: unreadable safetensors header")
        elif implied != path.stat().st_size:
            problems.append(f"{path.name}: {path.stat().st_size / 1e6:.1f} MB, its header "
                            f"says {implied / 1e6:.1f} MB")
    if not files and not list(d.glob("*.safetensors")):
        problems.append("no weights file")
    return problems


def manifest(directory: Path) -> dict[str, dict[str, Any]]:
    """``{file name: {"size", "sha256"}}`` for every file in ``directory``."""
    return {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)}
            for p in sorted(directory.iterdir()) if p.is_file()}


@contextmanager
def entry_lock(out: Path, lock: str, *, repair: bool, fix: str,
               log: Callable[[str], None]) -> Iterator[bool]:
    """Hold the file lock ``<cache>/locks/<lock>.lock`` of the prepared entry ``out``
    (a second process waits, then finds the entry done), remove the temporaries of
    killed preparations beside it, and yield whether ``out`` must be built: it is
    missing, or damaged and ``repair`` is on.

    Raises:
        ModelLoadError: ``out`` is damaged and ``repair`` is off (the message names
            the command ``fix``).
        CachePermissionError: the lock file (or the cache's folders) belongs to another
            user and is not writable by this one; a file of ``out`` is not readable by
            this user (never repaired: the message names the file, its owner and
            the fix).
    """
    locks = cache_root() / "locks"
    lock_path = locks / f"{lock}.lock"
    file_lock = _lock(lock_path)
    try:
        locks.mkdir(parents=True, exist_ok=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        file_lock.acquire()
    except PermissionError as exc:
        raise permission_error(Path(exc.filename or lock_path), write=True) from None
    try:
        remove_stale_temporaries(out.name, out.parent)
        problems = entry_problems(out, verify=repair) if is_prepared(out) else None
        if problems and not repair:
            raise damaged_error(out, problems, fix)
        if problems:
            log(f"repairing {out}: {'; '.join(problems)}")
        yield problems != []
    finally:
        file_lock.release()


def read_source(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ``gguf_source.json`` record of a prepared directory, or None when it has none
    (or an unreadable one).

    Raises:
        PermissionError: the record or its folder is another user's and not readable.
    """
    path = Path(directory) / SOURCE_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except PermissionError:
        raise
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


def prepare_gguf(
    path: str | os.PathLike[str],
    *,
    sha256: str | None = None,
    registry_name: str | None = None,
    extra: dict[str, Any] | None = None,
    log: Callable[[str], None] | None = None,
    repair: bool = False,
) -> Path:
    """The cached Hugging Face directory of a GGUF file, made on first use.

    The first call first compares the file's header with the config transformers
    builds from it (:func:`check_file`, :mod:`locos_tl.models.gguf_checks`): a field
    transformers drops is restored when that is exact, else the file is refused. It
    then dequantizes the file with transformers (float32), rebuilds the model from the
    (restored) config without the GGUF quantization config (a model loaded from GGUF
    cannot ``save_pretrained`` as it is), checks that the input and output embeddings
    are still tied where the config ties them, and saves weights (safetensors), config
    and tokenizer (chat template included) into a temporary folder that is renamed into
    place with its ``gguf_source.json`` (provenance, the fields checked and restored,
    and each written file's size and SHA-256). Later calls check the entry's sizes
    (:func:`entry_problems`) and return it.

    A file lock (``<cache root>/locks/gguf-<sha256>.lock``, ``filelock``) serialises
    preparations of one file: a second process waits and then loads the first one's
    entry. Temporary folders of killed preparations are removed
    (:func:`remove_stale_temporaries`).

    Args:
        path: the ``.gguf`` file.
        sha256: its SHA-256 when already known (skips hashing).
        registry_name: the :mod:`locos_tl.models.zoo` name it was fetched as (recorded).
        extra: more fields for ``gguf_source.json`` (e.g. the packages it came from).
        log: called with progress messages (default: silent).
        repair: hash the entry's files and prepare it again when damaged (``locos models
            fetch``); without it sizes are checked and a damaged entry raises.

    Returns:
        ``<cache root>/gguf/<sha256>/``.

    Raises:
        ModelLoadError: not a GGUF file; ``gguf`` not installed; transformers cannot
            read the file (unsupported architecture or quantization); the file describes
            a model transformers would load differently and the difference cannot be
            restored (the field, the architecture and the fix are named); the entry is
            damaged and ``repair`` is False (the files, and the command that repairs it).
        CachePermissionError: the entry is another user's and not readable by this one,
            or its lock file is not writable by this one (the file, its owner and the
            fix; a healthy entry this user can read needs no lock).
    """
    src = Path(path).expanduser().resolve()
    if not src.is_file():
        raise ModelLoadError(f"GGUF file {str(path)!r} does not exist")
    if not is_gguf_file(src):
        raise ModelLoadError(f"{str(path)!r} is not a GGUF file (no GGUF magic bytes)")
    digest = sha256 or sha256_file(src)
    out = cached_dir(digest)
    if is_prepared(out) and not entry_problems(out, verify=repair):
        return out
    say = log or (lambda _msg: None)
    with entry_lock(out, f"gguf-{digest}", repair=repair, fix=f"locos models fetch {src}",
                    log=say) as build:
        if not build:
            return out
        plan = check_file(src)  # refuses a file transformers would load as another model
        quant = quantization_type(src)
        say(f"dequantizing {src.name} ({quant.get('file_type', '?')}, "
            f"{src.stat().st_size / 1e6:.0f} MB) to float32; once, cached in {out}")
        with temporary_folder(out) as tmp:
            info = _convert(src, tmp, plan)
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
                "checked": plan.checked,
                "restored": plan.restored,
                **(extra or {}),
                "files": manifest(tmp),
            }
            (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=1) + "\n")
            install_entry(tmp, out)
    say(f"prepared {out}")
    return out


def damaged_error(directory: Path, problems: list[str], repair: str) -> ModelLoadError:
    """The error for a damaged prepared checkpoint: its files, and the repair command."""
    return ModelLoadError(f"the prepared checkpoint {directory} is damaged "
                          f"({'; '.join(problems)}); repair it with `{repair}`")


def check_file(src: str | os.PathLike[str]) -> Plan:
    """Compare a GGUF file's header with the config transformers builds from it
    (metadata only, no dequantizing): :func:`locos_tl.models.gguf_checks.reconcile`.

    Raises:
        ModelLoadError: ``gguf`` missing; transformers cannot read the file; a field
            transformers drops that cannot be restored exactly.
    """
    _require_gguf()
    from transformers import AutoConfig

    from locos_tl.models.quiet import quiet as _quiet

    src = Path(src)
    try:
        with _quiet():
            config = AutoConfig.from_pretrained(str(src.parent), gguf_file=src.name)
    except (OSError, ValueError, KeyError, NotImplementedError, RuntimeError) as exc:
        raise ModelLoadError(f"transformers cannot read the GGUF file {src}: {exc}") from exc
    return reconcile(read_header(str(src)), config.to_dict())


def _check_applied(src: Path, config: dict[str, Any], plan: Plan) -> None:
    """Every planned config field survived the config class's own normalisation."""
    for key, want in plan.config.items():
        if config.get(key) != want:
            raise ModelLoadError(f"{src.name}: restoring {key} = {want!r} left "
                                 f"{config.get(key)!r} in the config; load the original "
                                 "checkpoint (its directory or hub name) instead")


def _convert(src: Path, dest: Path, plan: Plan) -> dict[str, Any]:
    """Dequantize ``src`` with transformers, apply ``plan`` (what transformers dropped)
    and save it as a float32 HF directory."""
    _require_gguf()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from locos_tl.models.quiet import quiet as _quiet

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
    cfg_dict.update(plan.config)  # what transformers dropped (locos_tl.models.gguf_checks)
    config = type(loaded.config).from_dict(cfg_dict)
    _check_applied(src, config.to_dict(), plan)
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = loaded.state_dict()
    if plan.unpermute_qk is not None:
        unpermute_qk(state, *plan.unpermute_qk)
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
