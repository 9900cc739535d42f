"""Provenance saved next to every result: versions, model, dtype, settings, seed."""

from __future__ import annotations

import datetime as _dt
import platform
from importlib import metadata
from typing import Any

from locos_tl.models.load import model_name


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
        out["model"] = {
            "name": model_name(model),
            "dtype": dtype,
            "device": device,
            "n_layers": int(model.cfg.n_layers),
            "n_heads": int(model.cfg.n_heads),
            "n_key_value_heads": int(getattr(model.cfg, "n_key_value_heads", None)
                                     or model.cfg.n_heads),
            "weight_processing": "compatibility" if getattr(model, "compatibility_mode", False)
            else "raw_hf",
        }
        source = _gguf_source(out["model"]["name"])
        if source is not None:  # dequantized from a GGUF file (locos_tl.models.gguf_cache)
            out["model"]["source"] = source
    return out


def _gguf_source(name: str) -> dict[str, Any] | None:
    """Source GGUF file, SHA-256 and quantization type of a checkpoint prepared by
    :func:`locos_tl.models.gguf_cache.prepare_gguf`, or None for any other checkpoint.
    ``source_removed: True`` when the file was a copy assembled from its packages and
    deleted once prepared (Gemma-3-270m's chunks): ``source_file`` no longer exists,
    and the SHA-256 and packages identify it."""
    from locos_tl.models.gguf_cache import read_source

    rec = read_source(name)
    if rec is None:
        return None
    keys = ("registry_name", "packages", "source_file", "sha256", "quantization",
            "size_bytes")
    out = {"format": "gguf", **{k: rec.get(k) for k in keys}}
    if rec.get("source_removed"):
        out["source_removed"] = True
    return out
