"""Plain Hugging Face twins of a bridge's model: the same weight tensors, a faster kernel.

The TransformerBridge computes eager attention itself, so a forward through it forms
``[n_heads, P, P]`` scores per layer. A *twin* is a plain HF model of the same class and
config whose parameters and buffers are the bridge's own tensors (shared storage, no
copy), with ``attn_implementation="sdpa"``. Its equivalence to the bridge holds by
construction, not by a numeric probe:

- every twin parameter and buffer is the bridge model's tensor (same storage, shape and
  strides; checked with ``data_ptr``), and no twin tensor is left uninitialised;
- the twin's config equals the bridge model's config except for the attention kernel;
- the attention semantics the SDPA kernel implements (causal mask, sliding windows from
  ``config.layer_types`` / ``sliding_window``, GQA, scaling) are HF's own; configurations
  that SDPA does not implement identically (attention logit soft-capping, attention
  dropout) and placements that the twin cannot mirror (``device_map`` splits) are
  refused with the reason.

The numeric equivalence (KV cache and next-token logits equal to the bridge's own prefill
to 1e-5 in float32, sliding windows shorter than the prompt included) is a CI test on
Qwen3, Gemma-3, OLMo-2 and Llama (``tests/test_twin.py``). Low-precision rounding never
disables the twin: in bf16 the two kernels differ only by summation order.

When no twin can be built, callers fall back to the bridge and a ``RuntimeWarning`` names
the reason once per model; :func:`prefill_path` reports which path runs.
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from locos_tl.errors import warn_caller

_TWINS: weakref.WeakKeyDictionary[Any, dict[str, TwinInfo]] = weakref.WeakKeyDictionary()
_IGNORED_CONFIG_KEYS = {"_attn_implementation", "_attn_implementation_autoset",
                        "attn_implementation", "_attn_implementation_internal"}


class TwinUnavailable(RuntimeError):
    """No faithful twin can be built; the message is the reason."""


@dataclass(frozen=True)
class TwinInfo:
    """A twin (or None) and, when None, why the bridge must be used instead."""

    twin: Any | None
    reason: str | None

    @property
    def path(self) -> str:
        """``"sdpa_twin"`` or ``"bridge"``."""
        return "sdpa_twin" if self.twin is not None else "bridge"


def _clean(name: str) -> str:
    return name.replace("._original_component", "")


def _check_semantics(cfg: Any, attn_implementation: str) -> None:
    if attn_implementation == "eager":
        return
    softcap = getattr(cfg, "attn_logit_softcapping", None)
    if softcap:
        raise TwinUnavailable(
            f"attention logit soft-capping ({softcap}) is not implemented by {attn_implementation}"
        )
    dropout = float(getattr(cfg, "attention_dropout", 0.0) or 0.0)
    if dropout:
        raise TwinUnavailable(f"attention dropout {dropout} is set")


def build_twin(model: Any, attn_implementation: str = "sdpa") -> Any:
    """Build a plain HF twin of ``model.original_model`` sharing its tensors.

    Args:
        model: a TransformerBridge loaded from a Hugging Face checkpoint.
        attn_implementation: the twin's attention kernel (``"sdpa"`` or ``"eager"``).

    Returns:
        The twin in eval mode.

    Raises:
        TwinUnavailable: device-mapped model, unsupported attention semantics, a weight
            or buffer without a source in the bridge, or a config that differs.
    """
    hf = model.original_model
    if getattr(hf, "hf_device_map", None):
        raise TwinUnavailable("the model is split over devices (device_map)")
    cfg = copy.deepcopy(hf.config)
    _check_semantics(cfg, attn_implementation)
    from transformers import AutoModelForCausalLM

    params = list(hf.parameters())
    if not params:
        raise TwinUnavailable("the model has no parameters")
    with torch.device("meta"):
        twin = AutoModelForCausalLM.from_config(
            cfg, attn_implementation=attn_implementation, torch_dtype=params[0].dtype
        )
    if type(twin) is not type(hf):
        raise TwinUnavailable(
            f"the twin class {type(twin).__name__} differs from {type(hf).__name__}"
        )
    sources = {_clean(k): v for k, v in hf.state_dict(keep_vars=True).items()}
    sources.update({_clean(k): v for k, v in hf.named_buffers()})
    twin.load_state_dict({k: v.detach() for k, v in sources.items()}, strict=False,
                         assign=True)
    for name, buf in list(twin.named_buffers()):
        src = sources.get(name)
        if src is None:
            raise TwinUnavailable(f"no source for buffer {name}")
        mod_name, _, attr = name.rpartition(".")
        owner = twin.get_submodule(mod_name) if mod_name else twin
        if buf.is_meta or buf.data_ptr() != src.data_ptr():
            owner._buffers[attr] = src.detach()
    for name, p in twin.named_parameters():
        src = sources.get(name)
        if src is None or p.is_meta:
            raise TwinUnavailable(f"no source for parameter {name}")
        if (p.data_ptr(), p.shape, p.stride()) != (src.data_ptr(), src.shape, src.stride()):
            raise TwinUnavailable(f"parameter {name} is not the bridge's tensor")
    a = {k: v for k, v in twin.config.to_dict().items() if k not in _IGNORED_CONFIG_KEYS}
    b = {k: v for k, v in hf.config.to_dict().items() if k not in _IGNORED_CONFIG_KEYS}
    if a != b:
        diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        raise TwinUnavailable(f"config fields differ: {diff[:5]}")
    twin.eval()
    twin.requires_grad_(False)
    return twin


def twin_info(model: Any, attn_implementation: str = "sdpa") -> TwinInfo:
    """The cached twin of ``model`` (built on first use), or the reason there is none.

    A failure warns once per model (``RuntimeWarning`` naming the reason); later calls
    return the cached :class:`TwinInfo` silently.
    """
    per_model = _TWINS.setdefault(model, {})
    if attn_implementation not in per_model:
        try:
            info = TwinInfo(build_twin(model, attn_implementation), None)
        except TwinUnavailable as exc:
            info = TwinInfo(None, str(exc))
        except Exception as exc:  # an architecture HF cannot rebuild: still fall back loudly
            info = TwinInfo(None, f"{type(exc).__name__}: {exc}")
        if info.twin is None:
            warn_caller(
                f"fast {attn_implementation} twin unavailable ({info.reason}); running "
                "through the TransformerBridge's eager attention (slower, same values)",
                RuntimeWarning,
            )
        per_model[attn_implementation] = info
    return per_model[attn_implementation]


def sdpa_twin(model: Any) -> Any | None:
    """The SDPA twin of ``model`` or None (see :func:`twin_info`)."""
    return twin_info(model, "sdpa").twin
