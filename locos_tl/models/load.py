"""Loading models as TransformerLens :class:`TransformerBridge` objects.

TransformerLens 4 replaced ``HookedTransformer`` by ``TransformerBridge``, which wraps
the Hugging Face model and keeps the classic hook names (``blocks.{l}.attn.hook_pattern``,
``hook_v``, ``hook_z``, ``ln_final.hook_scale``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from locos_tl.errors import ModelLoadError
from locos_tl.models.identity import ModelIdentity, identity_of
from locos_tl.models.quiet import quiet as _quiet

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    """``"bf16"``/``"bfloat16"``/``torch.bfloat16`` -> ``torch.bfloat16``; None -> float32."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}") from None


def default_device() -> str:
    """``"cuda"`` when a GPU is visible, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_model(
    name_or_path: str | os.PathLike[str],
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    device_map: str | dict[str, Any] | None = None,
) -> Any:
    """Load a Hugging Face causal LM as a TransformerLens ``TransformerBridge``.

    Args:
        name_or_path: a hub name (``"Qwen/Qwen3-8B"``); a local directory holding
            ``config.json``, weights and tokenizer files (loaded offline); a ``.gguf``
            file (dequantized to float32 once and cached as a directory keyed by the
            file's SHA-256, :mod:`locos_tl.models.gguf_cache`; needs the ``gguf`` extra); or
            the name of a known real model fetched with ``locos models fetch NAME``
            (``"smollm2-135m-instruct"``, ``"gemma-3-270m"``; :mod:`locos_tl.models.zoo`).
        device: ``"cpu"``, ``"cuda"``, ...; default: CUDA when available.
        dtype: ``"float32"`` (default), ``"bfloat16"``, ``"float16"`` or a torch dtype.
        device_map: passed through to the HF model (accelerate placement), e.g.
            ``"auto"`` to spread a large model over several GPUs.

    Returns:
        The bridge in eval mode with raw HF weights (no weight processing).

    Raises:
        ModelLoadError: the local directory does not exist or lacks ``config.json``;
            the hub name is unknown or unreachable offline; the architecture has no
            TransformerLens adapter; a known real model is not fetched; a GGUF file
            transformers cannot read. Its subclass
            :class:`~locos_tl.errors.CachePermissionError`: a cached checkpoint is
            another user's and not readable by this one (whose, and the fix).
    """
    from transformer_lens import TransformerBridge

    from locos_tl.models.zoo import resolve_checkpoint

    local = resolve_checkpoint(name_or_path)  # a registry name or a .gguf file
    name = str(local if local is not None else name_or_path)
    torch_dtype = resolve_dtype(dtype)
    device = str(device) if device is not None else default_device()
    path = Path(name).expanduser()
    is_local = path.exists()
    if not is_local and (name.startswith((".", "/", "~")) or name.count("/") > 1):
        raise ModelLoadError(f"model directory {name!r} does not exist")
    if is_local:
        if not path.is_dir() or not (path / "config.json").exists():
            raise ModelLoadError(
                f"{name!r} is not a Hugging Face model directory (no config.json inside)"
            )
        _check_architecture(path)
        name = str(path.resolve())
    kwargs: dict[str, Any] = {"dtype": torch_dtype}
    if device_map is not None:  # accelerate placement; exclusive with `device`
        kwargs["device_map"] = device_map
    else:
        kwargs["device"] = device
    # HF/TL log loading chatter to stdout/stderr; keep the notebook clean, keep errors.
    try:
        with _quiet():
            bridge = TransformerBridge.boot_transformers(name, **kwargs)
    except ModelLoadError:
        raise
    except (OSError, ValueError, KeyError, NotImplementedError) as exc:
        msg = str(exc)
        if not is_local:
            raise ModelLoadError(
                f"could not load model {name!r} from the hub (unknown name, or offline and "
                f"not cached; download it with `hf download {name}` or pass a local "
                f"directory): {msg.splitlines()[0] if msg else type(exc).__name__}"
            ) from exc
        raise ModelLoadError(f"could not load model from {name!r}: {msg}") from exc
    bridge.eval()
    return bridge


def _check_architecture(path: Path) -> None:
    import json

    cfg = json.loads((path / "config.json").read_text())
    archs = cfg.get("architectures") or []
    if not archs:
        raise ModelLoadError(f"{path}/config.json names no architecture")
    try:
        from transformer_lens.factories.architecture_adapter_factory import (
            SUPPORTED_ARCHITECTURES,
        )
    except ImportError:  # layout changed: boot_transformers will decide
        return
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise ModelLoadError(
            f"architecture {archs[0]} (from {path}/config.json) has no TransformerLens "
            f"bridge adapter; supported include Qwen3ForCausalLM, Gemma3ForCausalLM, "
            f"Olmo2ForCausalLM, LlamaForCausalLM ({len(SUPPORTED_ARCHITECTURES)} in all)"
        )


def checkpoint_path(model: Any) -> str:
    """What a bridge was loaded from: its hub name or local directory (for a cached
    checkpoint, the cache entry's path on this machine); ``"unknown"`` when not
    recorded. Runs record :func:`model_name` instead."""
    cfg = getattr(model, "cfg", None)
    for attr in ("model_name", "name_or_path"):
        v = getattr(cfg, attr, None)
        if v:
            return str(v)
    hf = getattr(model, "original_model", None)
    return str(getattr(getattr(hf, "config", None), "_name_or_path", "unknown"))


def model_identity(model: Any) -> ModelIdentity:
    """The :class:`~locos_tl.models.identity.ModelIdentity` of a bridge's checkpoint:
    its name and, for a cache entry, its content hashes (never the cache path)."""
    path = checkpoint_path(model)
    return ModelIdentity(path) if path == "unknown" else identity_of(path)


def model_name(model: Any) -> str:
    """The name runs record for a bridge's checkpoint: the zoo name of a cached
    checkpoint (``"smollm2-135m-instruct"``, ``"smollm2-135m-nolima"``; the file name of
    a GGUF file outside the zoo), else its hub name or local path
    (:mod:`locos_tl.models.identity`)."""
    name = model_identity(model).name
    return str(name) if name is not None else checkpoint_path(model)


def model_settings(model: Any) -> dict[str, Any]:
    """``{"model": name, "model_hashes": {...}}``: the model's identity as run settings
    record it (``model_hashes`` only for cache entries: ``gguf_sha256``, and
    ``adapter_sha256`` for an elicited model)."""
    identity = model_identity(model)
    out = identity.settings()
    if identity.name is None:  # a GGUF file outside the zoo, unnamed: where it loaded from
        out["model"] = checkpoint_path(model)
    return out


def model_dtype(model: Any) -> str:
    """``"float32"``, ``"bfloat16"``, ... of the model's parameters."""
    return str(next(model.parameters()).dtype).replace("torch.", "")


def n_ctx(model: Any) -> int | None:
    """The model's context length from its config (``cfg.n_ctx``), if known."""
    v = getattr(getattr(model, "cfg", None), "n_ctx", None)
    return int(v) if v else None
