"""Provenance saved next to every result: versions, model, dtype, settings, seed."""

from __future__ import annotations

import datetime as _dt
import platform
from importlib import metadata
from typing import Any

from locos_tl.models.load import checkpoint_path, model_identity


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def provenance(model: Any = None, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """A JSON-serialisable provenance record.

    Args:
        model: the TransformerBridge used (name, dtype, weight-processing mode recorded).
        settings: run settings (variant, seed, trial-set hash, ...), stored under
            ``"settings"``.
    """
    out: dict[str, Any] = {
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "versions": {
            p: _version(p)
            for p in ("locos_tl", "transformer-lens", "transformers", "torch")
        },
        "python": platform.python_version(),
        "settings": dict(settings or {}),
    }
    if model is not None:
        try:
            param = next(model.parameters())
            dtype, device = str(param.dtype).replace("torch.", ""), str(param.device)
        except StopIteration:
            dtype = device = None
        identity = model_identity(model)
        out["model"] = {
            "name": identity.name if identity.name is not None else checkpoint_path(model),
            "dtype": dtype,
            "device": device,
            "n_layers": int(model.cfg.n_layers),
            "n_heads": int(model.cfg.n_heads),
            "n_key_value_heads": int(getattr(model.cfg, "n_key_value_heads", None)
                                     or model.cfg.n_heads),
            "weight_processing": "compatibility" if getattr(model, "compatibility_mode", False)
            else "raw_hf",
        }
        if identity.hashes:  # a cache entry: the content hashes that identify it
            out["model"]["hashes"] = dict(sorted(identity.hashes.items()))
        source = _cache_source(checkpoint_path(model))
        if source is not None:  # a cache entry (locos_tl.models.gguf_cache, .elicited)
            out["model"]["source"] = source
    return out


def _cache_source(path: str) -> dict[str, Any] | None:
    """Where a cache entry came from, or None for any other checkpoint.

    A checkpoint prepared by :func:`locos_tl.models.gguf_cache.prepare_gguf`: its GGUF
    file's SHA-256, quantization type and size, the zoo name and packages it was
    fetched as, and where it was read from: ``file_name`` for a zoo file (its packages
    and hash identify it; its path is this machine's), ``source_file`` (the path) for a
    file prepared outside the zoo. ``source_removed: True`` when the file was a copy
    assembled from its packages and deleted once prepared (Gemma-3-270m's chunks).

    An elicited model (:mod:`locos_tl.models.elicited`): its name, base model, and the
    SHA-256 of its adapter and of its base's GGUF file.
    """
    from locos_tl.models.gguf_cache import read_source

    try:
        rec = read_source(path)
    except OSError:
        return None
    if rec is None:
        return None
    if rec.get("elicited"):
        from locos_tl.models.identity import identity_of

        hashes = identity_of(path).hashes
        return {"format": "elicited", "elicited": rec.get("elicited"), "base": rec.get("base"),
                "adapter_sha256": rec.get("adapter_sha256"),
                "base_sha256": hashes.get("gguf_sha256")}
    from pathlib import Path

    from locos_tl.models.identity import zoo_name

    registry = rec.get("registry_name") or zoo_name(str(rec.get("sha256")))
    out: dict[str, Any] = {"format": "gguf", "registry_name": registry,
                           "packages": rec.get("packages")}
    if registry is None:  # the user's own file: where it was read from
        out["source_file"] = rec.get("source_file")
    else:  # a zoo file: its packages and hash identify it; its path is this machine's
        out["file_name"] = rec.get("file_name") or Path(str(rec.get("source_file"))).name
    out.update({k: rec.get(k) for k in ("sha256", "quantization", "size_bytes")})
    if rec.get("source_removed"):
        out["source_removed"] = True
    return out
