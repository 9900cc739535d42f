"""Greedy decoding that exposes, at every step, the attention rows and values of all heads.

One pass feeds every detector: the prompt is prefilled once (fast SDPA twin of the HF
model sharing the bridge's weight tensors, or the bridge itself in query chunks), then
each decode step runs through the TransformerBridge with hooks on
``blocks.{l}.attn.hook_pattern`` (only the query row is kept) and the norm scales; values
are read from the KV cache (they equal ``hook_v``). Memory is linear in context length:
no ``N x N`` tensor is kept, and the bridge's eager attention sees at most
``chunk_size x N`` scores at a time (SDPA twin: one causal call, linear memory).

Decoding step ``t`` is the forward position whose logits choose ``y_t``: step 1 is the
last prompt token with ``N`` keys, step ``t`` has ``N + t - 1`` keys (docs/concepts.md).
"""

from __future__ import annotations

import copy
import logging
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from locos_tl.errors import TrialError
from locos_tl.kernel import phi_layer
from locos_tl.unembed import AnswerDirections

log = logging.getLogger(__name__)

_TWINS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


@dataclass
class DecodeStep:
    """Everything detectors need about one decoding step (batch size 1).

    Attributes:
        t: 0-based index of the generated token this step chose.
        token: the greedy token ``y_t``.
        key_tokens: ids of the ``N_t`` key positions (prompt + earlier generated tokens).
        pattern: attention rows of the query, ``[n_layers, n_heads, N_t]`` (float32,
            probability; zero-padded on the left for sliding-window layers).
        values: per layer, ``[N_t, n_kv_heads, d_head]`` values (views of the KV cache).
        scales: norm ``hook_scale`` values at the query position (``exact`` variant).
        logits: the step's output logits, ``[d_vocab]``.
    """

    t: int
    token: int
    key_tokens: Tensor
    pattern: Float[Tensor, "n_layers n_heads pos"]
    values: list[Tensor]
    scales: dict[str, float]
    logits: Tensor
    _W_O: list[Tensor] = field(repr=False, default_factory=list)
    _directions: AnswerDirections | None = field(repr=False, default=None)

    @property
    def n_keys(self) -> int:
        return int(self.pattern.shape[-1])

    @cached_property
    def phi(self) -> Float[Tensor, "n_layers n_heads pos"]:
        """LOCOS ``phi[l, h, j]`` for ``y_t`` (Eq. 2), logits, computed once per step."""
        if self._directions is None:
            raise RuntimeError("this step was captured without answer directions")
        u = self._directions(self.token, self.scales)
        out = []
        for layer, v in enumerate(self.values):
            # under a device_map split each layer's values and W_O live on that layer's
            # device: compute there, gather the [n_heads, pos] result on pattern's device
            dev = v.device
            phi = phi_layer(self.pattern[layer].to(dev), v, self._W_O[layer].to(dev),
                            u[layer].to(dev))
            out.append(phi.to(self.pattern.device))
        return torch.stack(out)


@dataclass
class DecodeResult:
    """Output of :func:`greedy_decode`: generated ids (stop token included) and text."""

    prompt_len: int
    generated: list[int]
    text: str
    stopped_by: str


def _hf_model(model: Any) -> Any:
    return model.original_model


def _new_cache(model: Any) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=_hf_model(model).config)


def sdpa_twin(model: Any) -> Any | None:
    """A plain HF model with SDPA attention sharing the bridge's weight tensors (no copy).

    Used only to prefill the prompt fast (the bridge forces eager attention). Returns
    None when no faithful twin can be built (device maps, multimodal wrappers, or a
    logit mismatch against the bridge on a probe sequence).
    """
    if model in _TWINS:
        return _TWINS[model]
    twin = None
    hf = _hf_model(model)
    try:
        if getattr(hf, "hf_device_map", None):
            raise RuntimeError("device-mapped model")
        from transformers import AutoModelForCausalLM

        cfg = copy.deepcopy(hf.config)
        with torch.device("meta"):
            twin = AutoModelForCausalLM.from_config(
                cfg, attn_implementation="sdpa", torch_dtype=next(hf.parameters()).dtype
            )
        clean = lambda k: k.replace("._original_component", "")  # noqa: E731
        sd = {clean(k): v for k, v in hf.state_dict().items()}
        twin.load_state_dict(sd, strict=False, assign=True)
        buffers = {clean(k): v for k, v in hf.named_buffers()}
        for name, buf in list(twin.named_buffers()):
            if buf.is_meta:
                mod_name, _, attr = name.rpartition(".")
                src = buffers.get(name)
                if src is None:
                    raise RuntimeError(f"no source for buffer {name}")
                setattr(twin.get_submodule(mod_name) if mod_name else twin, attr, src)
        if any(p.is_meta for p in twin.parameters()):
            raise RuntimeError("twin has unset parameters")
        twin.eval()
        probe = torch.arange(min(12, int(model.cfg.d_vocab)), device=next(hf.parameters()).device)
        probe = probe.unsqueeze(0) % int(model.cfg.d_vocab)
        with torch.no_grad():
            a = twin(probe).logits.float()
            b = model(probe, return_type="logits").float()
        fp32 = next(hf.parameters()).dtype == torch.float32
        tol = 1e-3 if fp32 else 5e-2
        if not torch.allclose(a, b, atol=tol * max(1.0, b.abs().max().item()), rtol=0):
            raise RuntimeError(f"twin logits differ by {(a - b).abs().max().item():.3g}")
    except Exception as exc:  # any failure: fall back to the bridge's own prefill
        log.info("SDPA prefill twin unavailable (%s); prefilling through the bridge", exc)
        twin = None
    _TWINS[model] = twin
    return twin


@torch.no_grad()
def prefill(
    model: Any, tokens: Tensor, *, mode: str = "auto", chunk_size: int | None = None
) -> Any:
    """Fill a fresh KV cache with ``tokens`` (``[1, P]``); returns the cache.

    Args:
        mode: ``"sdpa"`` (twin model, fastest), ``"bridge"`` (the bridge's own eager
            forward), or ``"auto"`` (twin when available and no hook is attached).
        chunk_size: queries per forward. Default: the whole prompt for the SDPA twin
            (its causal kernel never forms an ``N x N`` tensor, so memory is linear and
            one call is fastest) and 1024 for the bridge, whose eager attention forms
            ``[n_heads, chunk, N]`` scores.

    Raises:
        ValueError: unknown mode.
    """
    if mode not in ("auto", "sdpa", "bridge"):
        raise ValueError(f"unknown prefill mode {mode!r}; use 'auto', 'sdpa' or 'bridge'")
    cache = _new_cache(model)
    if tokens.shape[1] == 0:
        return cache
    if mode == "auto" and _hooks_attached(model):  # e.g. inside `ablate`: the twin
        mode = "bridge"  # fires no TransformerLens hook, so prefill through the bridge
    twin = sdpa_twin(model) if mode in ("auto", "sdpa") else None
    if mode == "sdpa" and twin is None:
        raise ValueError("no SDPA twin can be built for this model; use prefill='bridge'")
    if chunk_size is None:
        chunk_size = tokens.shape[1] if twin is not None else 1024
    for i in range(0, tokens.shape[1], chunk_size):
        chunk = tokens[:, i : i + chunk_size]
        if twin is not None:
            twin(chunk, past_key_values=cache, use_cache=True, logits_to_keep=1)
        else:
            model(chunk, return_type=None, past_key_values=cache, use_cache=True)
    return cache


def _hooks_attached(model: Any) -> bool:
    """Whether any TransformerLens forward hook is attached to ``model``."""
    points = getattr(model, "hook_points", None)
    return callable(points) and any(getattr(hp, "fwd_hooks", None) for hp in points())


def _cache_values(cache: Any, layer: int) -> Tensor:
    vals = cache.layers[layer].values  # [1, n_kv, K, d_head]
    return vals[0].transpose(0, 1)  # [K, n_kv, d_head]


def _stop_ids(model: Any) -> set[int]:
    ids: set[int] = set()
    tok = model.tokenizer
    gen_cfg = getattr(_hf_model(model), "generation_config", None)
    for src in (getattr(tok, "eos_token_id", None), getattr(gen_cfg, "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, Sequence):
            ids.update(int(i) for i in src)
    return ids


@torch.no_grad()
def greedy_decode(
    model: Any,
    tokens: Sequence[int] | Tensor,
    *,
    max_new_tokens: int = 50,
    on_step: Callable[[DecodeStep], None] | None = None,
    directions: AnswerDirections | None = None,
    stop_at_newline: bool = True,
    stop_at_eos: bool = True,
    prefill_mode: str = "auto",
    chunk_size: int | None = None,
    forced_tokens: Sequence[int] | None = None,
) -> DecodeResult:
    """Free greedy decoding through the bridge, calling ``on_step`` at every step.

    Args:
        model: a TransformerBridge (batch size 1).
        tokens: prompt ids, length ``N >= 1``.
        max_new_tokens: at most this many generated tokens.
        on_step: called with a :class:`DecodeStep` (pattern rows, values, ``y_t``) per step.
        directions: answer directions for ``DecodeStep.phi``; needed only by phi users.
        stop_at_newline: stop after a token whose text contains a newline.
        stop_at_eos: stop after an end-of-sequence token.
        prefill_mode, chunk_size: see :func:`prefill`.
        forced_tokens: teacher forcing: step ``t`` takes ``forced_tokens[t]`` instead of
            the argmax (decoding ends when they run out).

    Returns:
        The generated ids (the stop token included) and the decoded response text
        (stop token excluded, stripped).

    Raises:
        TrialError: empty prompt, or prompt + ``max_new_tokens`` longer than ``n_ctx``.
    """
    ids = torch.as_tensor(tokens, dtype=torch.long).reshape(1, -1)
    N = ids.shape[1]
    if N == 0:
        raise TrialError("empty prompt")
    n_ctx = getattr(model.cfg, "n_ctx", None)
    if n_ctx and N + max_new_tokens - 1 > n_ctx:  # the last new token is never fed
        raise TrialError(
            f"prompt of {N} tokens + {max_new_tokens} new tokens exceeds the model's "
            f"context n_ctx={n_ctx}"
        )
    device = next(_hf_model(model).parameters()).device
    ids = ids.to(device)
    n_layers = int(model.cfg.n_layers)
    W_O = [model.blocks[l].attn.W_O.detach() for l in range(n_layers)]
    scale_hooks = directions.hook_names() if directions is not None else []

    cache = prefill(model, ids[:, :-1], mode=prefill_mode, chunk_size=chunk_size)
    rows: dict[int, Tensor] = {}
    scales: dict[str, float] = {}

    def keep_row(pattern: Tensor, hook: Any) -> None:
        rows[int(hook.name.split(".")[1])] = pattern[0, :, -1, :].detach().to(torch.float32)

    def keep_scale(scale: Tensor, hook: Any) -> None:
        scales[hook.name] = float(scale.reshape(scale.shape[0], scale.shape[1], -1)[0, -1, 0])

    fwd_hooks = [(f"blocks.{l}.attn.hook_pattern", keep_row) for l in range(n_layers)]
    fwd_hooks += [(name, keep_scale) for name in scale_hooks]
    stop_ids = _stop_ids(model) if stop_at_eos else set()
    tok = model.tokenizer

    key_tokens = ids[0].clone()
    step_input = ids[:, -1:]
    generated: list[int] = []
    stopped_by = "max_new_tokens"
    if forced_tokens is not None:
        max_new_tokens = min(max_new_tokens, len(forced_tokens))
    for t in range(max_new_tokens):
        rows.clear()
        scales.clear()
        logits = model.run_with_hooks(
            step_input, fwd_hooks=fwd_hooks, past_key_values=cache, use_cache=True,
            return_type="logits",
        )[0, -1]
        y = int(logits.argmax()) if forced_tokens is None else int(forced_tokens[t])
        n_keys = key_tokens.shape[0]
        pattern = torch.zeros(n_layers, int(model.cfg.n_heads), n_keys, device=device)
        values = []
        for l in range(n_layers):
            row = rows[l]
            pattern[l, :, n_keys - row.shape[-1] :] = row
            v = _cache_values(cache, l)
            if v.shape[0] < n_keys:  # sliding-window layer: keys are the last K positions
                pad = v.new_zeros(n_keys - v.shape[0], *v.shape[1:])
                v = torch.cat([pad, v])
            values.append(v)
        if on_step is not None:
            on_step(DecodeStep(t=t, token=y, key_tokens=key_tokens, pattern=pattern,
                               values=values, scales=dict(scales), logits=logits,
                               _W_O=W_O, _directions=directions))
        generated.append(y)
        key_tokens = torch.cat([key_tokens, key_tokens.new_tensor([y])])
        if y in stop_ids:
            stopped_by = "eos"
            break
        if stop_at_newline and "\n" in tok.decode([y]):
            stopped_by = "newline"
            break
        step_input = ids.new_tensor([[y]])
    body = generated[:-1] if stopped_by != "max_new_tokens" else generated
    text = tok.decode(body, skip_special_tokens=True).strip()
    return DecodeResult(prompt_len=N, generated=generated, text=text, stopped_by=stopped_by)
