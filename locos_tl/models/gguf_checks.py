"""What a GGUF file describes against what transformers' GGUF loader makes of it.

transformers reads a GGUF file's metadata into a Hugging Face config, but it drops some
fields llama.cpp honours, and the model then computes something else without a word
(checked with transformers 5.17-5.23):

- Llama-3.1/3.2 files store their rope scaling as the ``rope_freqs`` tensor of
  per-frequency factors (llama.cpp PR #8676): ignored, plain RoPE is used;
- ``{arch}.rope.scaling.type`` / ``.factor`` (Gemma-3 4B-27B: linear, factor 8): not read;
- a llama file without ``head_count_kv`` (older converters): the Q/K un-permutation is
  skipped (transformers #31766);
- Gemma-2/3 27B scale queries by ``d_model / n_heads`` (llama.cpp's rule), not
  ``head_dim``: transformers keeps its default.

:func:`reconcile` compares the file's header (metadata and tensor list) with the config
transformers would build, field by field: rope scaling type and factor, the
``rope_freqs`` tensor, ``head_count_kv``, the sliding-window size and layer pattern,
attention and final logit soft-capping, the query pre-attention scalar and the tied
output. A dropped field is restored (config values, or the Q/K un-permutation of the
weights) when the restoration is exact, else the file is refused with
:class:`~locos_tl.errors.ModelLoadError` naming the field, the architecture and the fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from locos_tl.errors import ModelLoadError

#: the llama.cpp layer pattern of sliding-window layers when a file does not store one:
#: every ``n``-th layer is full attention (``hparams.set_swa_pattern``)
_SWA_PATTERN = {"gemma2": 2, "gemma3": 6}
#: the number of layers that marks the 27B model, whose queries llama.cpp scales by
#: ``1/sqrt(d_model / n_heads)`` (``LLM_TYPE_27B``)
_LAYERS_27B = {"gemma2": 46, "gemma3": 62}
_PERMUTED_QK = ("llama", "mistral")  # llama.cpp permutes Q/K rows for these
_RTOL = 1e-5


def require_gguf() -> Any:
    """The ``gguf`` package.

    Raises:
        ModelLoadError: it is not installed (the message says how to install it).
    """
    try:
        import gguf
    except ImportError:
        raise ModelLoadError(
            "reading GGUF files needs the `gguf` package: pip install 'locos_tl[gguf]' "
            "(or pip install 'gguf>=0.10')"
        ) from None
    return gguf


@dataclass
class Header:
    """A GGUF file's metadata and tensor names (no tensor data but ``rope_freqs``).

    Attributes:
        architecture: ``general.architecture`` (``"llama"``, ``"gemma3"``, ...).
        fields: every metadata key (architecture prefix kept) to its value.
        tensors: the tensor names.
        rope_freqs: the ``rope_freqs`` tensor's values, when the file has one.
    """

    architecture: str
    fields: dict[str, Any]
    tensors: set[str]
    rope_freqs: list[float] | None = None

    def get(self, key: str, default: Any = None) -> Any:
        """The architecture's key ``key`` (``"rope.scaling.type"``), or ``default``."""
        return self.fields.get(f"{self.architecture}.{key}", default)


@dataclass
class Plan:
    """What to change in transformers' conversion to get the model the file describes.

    Attributes:
        config: config fields to set (``rope_parameters``, ``query_pre_attn_scalar``, ...).
        unpermute_qk: ``(n_heads, n_kv_heads)`` when the Q and K rows still carry
            llama.cpp's permutation and must be un-permuted; else None.
        restored: one record per restored field (``field``, ``file``, ``transformers``,
            ``restored``), saved in ``gguf_source.json``.
        checked: the fields compared.
    """

    config: dict[str, Any] = field(default_factory=dict)
    unpermute_qk: tuple[int, int] | None = None
    restored: list[dict[str, Any]] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)


def read_header(path: str) -> Header:
    """Read a GGUF file's metadata and tensor list (``gguf`` package; no dequantizing).

    Raises:
        ModelLoadError: the ``gguf`` package is missing.
    """
    gguf = require_gguf()
    reader = gguf.GGUFReader(path)
    fields: dict[str, Any] = {}
    for key, f in reader.fields.items():
        try:
            value = f.contents()
        except (ValueError, TypeError, IndexError):
            continue
        fields[key] = value
    freqs = None
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            freqs = [float(x) for x in gguf.dequantize(t.data, t.tensor_type).reshape(-1)]
    return Header(architecture=str(fields.get("general.architecture", "")), fields=fields,
                  tensors={t.name for t in reader.tensors}, rope_freqs=freqs)


def _refuse(header: Header, what: str) -> ModelLoadError:
    return ModelLoadError(
        f"GGUF file ({header.architecture}): {what}. transformers' GGUF loader would build "
        f"a different model from it, so locos_tl refuses it; load the original checkpoint "
        f"instead (its Hugging Face directory or hub name, e.g. load_model('org/model'))")


def reconcile(header: Header, config: dict[str, Any]) -> Plan:
    """Compare the file's header with transformers' config; plan the restorations.

    Args:
        header: :func:`read_header` of the file.
        config: the config transformers builds from it (``config.to_dict()``).

    Returns:
        The :class:`Plan` (empty when transformers already holds every field).

    Raises:
        ModelLoadError: a field that cannot be restored exactly (a rope scaling type
            transformers does not read, ``rope_freqs`` that no Llama-3 rope reproduces,
            ``rope_freqs`` on another architecture); the message names the field, the
            architecture and the fix (the original checkpoint).
    """
    plan = Plan()
    _check_rope(header, config, plan)
    _check_kv_heads(header, config, plan)
    _check_sliding(header, config, plan)
    _check_softcapping(header, config, plan)
    _check_query_scale(header, config, plan)
    _check_tied_output(header, config, plan)
    return plan


def _restore(plan: Plan, name: str, file_value: Any, hf_value: Any, restored: Any) -> None:
    plan.restored.append({"field": name, "file": file_value, "transformers": hf_value,
                          "restored": restored})


# ------------------------------------------------------------------------- rope scaling
def _rope_slot(config: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The rope parameters llama.cpp's scaling applies to (Gemma-3: full attention)."""
    rope = dict(config.get("rope_parameters") or {})
    if "full_attention" in rope:
        return dict(rope["full_attention"]), "full_attention"
    return rope, None


def _set_rope(config: dict[str, Any], plan: Plan, params: dict[str, Any],
              slot: str | None) -> None:
    rope = dict(plan.config.get("rope_parameters") or config.get("rope_parameters") or {})
    if slot is None:
        rope = params
    else:
        rope[slot] = params
    plan.config["rope_parameters"] = rope


def _check_rope(header: Header, config: dict[str, Any], plan: Plan) -> None:
    plan.checked += ["rope.scaling.type", "rope.scaling.factor", "rope_freqs"]
    current, slot = _rope_slot(config)
    kind = header.get("rope.scaling.type")
    if header.rope_freqs is not None:
        if header.architecture not in _PERMUTED_QK:
            raise _refuse(header, "the `rope_freqs` tensor (per-frequency rope factors) is "
                                  "not read by transformers for this architecture")
        if kind not in (None, "none"):
            raise _refuse(header, f"both a `rope_freqs` tensor and rope.scaling.type {kind!r}")
        params = _fit_llama3(header, config)
        if current.get("rope_type") != "llama3" or any(
                not math.isclose(float(current.get(k, math.nan)), float(v), rel_tol=_RTOL)
                for k, v in params.items() if k != "rope_type"):
            _set_rope(config, plan, params, slot)
            _restore(plan, "rope_freqs", "per-frequency factors "
                     f"{min(header.rope_freqs):g}-{max(header.rope_freqs):g}",
                     current.get("rope_type"), params)
        return
    if kind in (None, "none"):
        return
    factor = header.get("rope.scaling.factor")
    if kind == "linear" and factor is not None:
        if current.get("rope_type") == "linear" and math.isclose(
                float(current.get("factor", math.nan)), float(factor), rel_tol=_RTOL):
            return
        params = {**current, "rope_type": "linear", "factor": float(factor)}
        _set_rope(config, plan, params, slot)
        _restore(plan, "rope.scaling.type", {"type": kind, "factor": factor},
                 {"rope_type": current.get("rope_type"), "factor": current.get("factor")},
                 params)
        return
    if current.get("rope_type") == kind and (factor is None or math.isclose(
            float(current.get("factor", math.nan)), float(factor), rel_tol=_RTOL)):
        return  # transformers read it (e.g. gpt-oss's yarn)
    raise _refuse(header, f"rope.scaling.type {kind!r} (factor {factor}) is not read by "
                          f"transformers, which would use {current.get('rope_type')!r}")


def _fit_llama3(header: Header, config: dict[str, Any]) -> dict[str, Any]:
    """Llama-3 rope parameters that reproduce the file's ``rope_freqs`` exactly.

    llama.cpp divides frequency ``i`` by ``rope_freqs[i]``; transformers' ``llama3``
    rope has four parameters. The factor is the largest entry; the smooth band between
    1 and the factor is linear in 1/wavelength, which fixes the band's edges. Each
    candidate is checked against the tensor with transformers' own ``llama3`` function.
    """
    import torch
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    freqs = torch.tensor(header.rope_freqs, dtype=torch.float64)
    current, _ = _rope_slot(config)
    base = float(current.get("rope_theta", header.get("rope.freq_base", 10000.0)))
    head_dim = int(config.get("head_dim") or
                   config["hidden_size"] // config["num_attention_heads"])
    if 2 * len(freqs) != head_dim:
        raise _refuse(header, f"`rope_freqs` has {len(freqs)} entries for head_dim {head_dim}")
    plain = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    want = plain / freqs
    factor = float(freqs.max())
    candidates = [(8192.0, 1.0, 4.0)]  # Llama-3.1/3.2's own
    wavelen = 2 * math.pi / plain
    band = (freqs > 1 + 1e-6) & (freqs < factor - 1e-6 * factor)
    if band.any() and factor > 1:
        smooth = (1 / freqs[band] - 1 / factor) / (1 - 1 / factor)
        x = 1 / wavelen[band]
        if len(x) >= 2:  # smooth = a x + b  ->  low = 1, high = 1 - 1/b, L = a (high - 1)
            a = float(((x - x.mean()) * (smooth - smooth.mean())).sum()
                      / ((x - x.mean()) ** 2).sum())
            b = float(smooth.mean() - a * x.mean())
            if b < 0:
                candidates.append((a * (-1 / b), 1.0, 1 - 1 / b))
        else:  # one point: assume llama's low 1, high 4
            candidates.append((float(wavelen[band][0] * (3 * smooth[0] + 1)), 1.0, 4.0))
    rounded = [(int(round(o)), round(lo, 4), round(hi, 4)) for o, lo, hi in candidates[1:]]
    for old, low, high in candidates[:1] + rounded + candidates[1:]:
        params = {"rope_type": "llama3", "rope_theta": base, "factor": factor,
                  "low_freq_factor": low, "high_freq_factor": high,
                  "original_max_position_embeddings": old}
        cfg = LlamaConfig(hidden_size=config["hidden_size"], head_dim=head_dim,
                          num_attention_heads=config["num_attention_heads"],
                          max_position_embeddings=config.get("max_position_embeddings", 2048),
                          rope_parameters=dict(params))
        got, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
        if torch.allclose(got.double(), want, rtol=_RTOL, atol=0):
            return params
    raise _refuse(header, "its `rope_freqs` tensor (per-frequency rope factors "
                          f"{[round(float(f), 4) for f in freqs]}) matches no Llama-3 rope "
                          "scaling transformers can express")


# ------------------------------------------------------------------- heads and windows
def _check_kv_heads(header: Header, config: dict[str, Any], plan: Plan) -> None:
    plan.checked.append("attention.head_count_kv")
    n_heads = int(config["num_attention_heads"])
    file_kv = header.get("attention.head_count_kv")
    hf_kv = config.get("num_key_value_heads") or n_heads
    if file_kv is None:
        # llama.cpp's default is one kv head per query head
        if hf_kv != n_heads:
            plan.config["num_key_value_heads"] = n_heads
        if header.architecture in _PERMUTED_QK:
            plan.unpermute_qk = (n_heads, n_heads)
            _restore(plan, "attention.head_count_kv", None,
                     "Q/K rows left in llama.cpp's rotary permutation",
                     f"un-permuted with {n_heads} kv heads (llama.cpp's default)")
        return
    if isinstance(file_kv, list):
        return  # per-layer counts (LFM2): transformers takes their maximum itself
    if int(file_kv) != int(hf_kv):
        plan.config["num_key_value_heads"] = int(file_kv)
        _restore(plan, "attention.head_count_kv", file_kv, hf_kv, int(file_kv))


def _check_sliding(header: Header, config: dict[str, Any], plan: Plan) -> None:
    window = header.get("attention.sliding_window")
    if window is not None:
        plan.checked.append("attention.sliding_window")
        if config.get("sliding_window") != int(window):
            plan.config["sliding_window"] = int(window)
            _restore(plan, "attention.sliding_window", window, config.get("sliding_window"),
                     int(window))
    layer_types = config.get("layer_types")
    if not layer_types:
        return
    n = len(layer_types)
    pattern = header.get("attention.sliding_window_pattern")
    if isinstance(pattern, list):
        want = ["sliding_attention" if p else "full_attention" for p in pattern]
    elif pattern is not None or header.architecture in _SWA_PATTERN:
        p = int(pattern) if pattern is not None else _SWA_PATTERN[header.architecture]
        want = ["sliding_attention" if p and i % p < p - 1 else "full_attention"
                for i in range(n)]
    else:
        return
    plan.checked.append("attention.sliding_window_pattern")
    if len(want) != n:
        raise _refuse(header, f"attention.sliding_window_pattern has {len(want)} layers, "
                              f"the model {n}")
    if list(layer_types) != want:
        plan.config["layer_types"] = want
        _restore(plan, "attention.sliding_window_pattern", pattern, layer_types, want)


def _check_softcapping(header: Header, config: dict[str, Any], plan: Plan) -> None:
    for key, attr in (("attn_logit_softcapping", "attn_logit_softcapping"),
                      ("final_logit_softcapping", "final_logit_softcapping")):
        value = header.get(key)
        if value is None:
            continue
        plan.checked.append(key)
        have = config.get(attr)
        if have is None or not math.isclose(float(have), float(value), rel_tol=_RTOL):
            plan.config[attr] = float(value)
            _restore(plan, key, value, have, float(value))


def _check_query_scale(header: Header, config: dict[str, Any], plan: Plan) -> None:
    if "query_pre_attn_scalar" not in config:
        return
    plan.checked.append("query_pre_attn_scalar")
    scale = header.get("attention.scale")
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if scale is not None:
        want = 1.0 / float(scale) ** 2
    elif config.get("num_hidden_layers") == _LAYERS_27B.get(header.architecture):
        want = config["hidden_size"] / config["num_attention_heads"]
    else:
        want = float(head_dim)
    have = float(config["query_pre_attn_scalar"])
    if not math.isclose(have, want, rel_tol=_RTOL):
        value = int(want) if float(want).is_integer() else want
        plan.config["query_pre_attn_scalar"] = value
        _restore(plan, "query_pre_attn_scalar", f"1/sqrt({want:g}) (llama.cpp)", have, value)


def _check_tied_output(header: Header, config: dict[str, Any], plan: Plan) -> None:
    plan.checked.append("output.weight (tied output)")
    tied = "output.weight" not in header.tensors
    if bool(config.get("tie_word_embeddings")) != tied:
        plan.config["tie_word_embeddings"] = tied
        _restore(plan, "output.weight", "absent" if tied else "present",
                 config.get("tie_word_embeddings"), tied)


def unpermute_qk(state: dict[str, Any], n_heads: int, n_kv_heads: int) -> None:
    """Undo llama.cpp's Q/K row permutation in place (``q_proj`` with ``n_heads``,
    ``k_proj`` with ``n_kv_heads``), as transformers does when it knows the counts."""
    for name, w in list(state.items()):
        if name.endswith("self_attn.q_proj.weight"):
            n = n_heads
        elif name.endswith("self_attn.k_proj.weight"):
            n = n_kv_heads
        else:
            continue
        dim = w.shape[0] // n // 2
        state[name] = (w.reshape(n, dim, 2, *w.shape[1:]).transpose(1, 2)
                       .reshape(w.shape).contiguous())
