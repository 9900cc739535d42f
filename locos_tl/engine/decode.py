"""Greedy decoding that exposes, at every step, the attention rows and values of all heads.

One pass feeds every detector: the prompt is prefilled once (fast SDPA twin of the HF
model sharing the bridge's weight tensors, or the bridge itself in query chunks), then
each decode step runs on one of two engines (``decode_engine``): the *eager twin* (a
plain HF model sharing the bridge's tensors, :mod:`locos_tl.engine.twin`, called with
``output_attentions=True``: a query of length 1 costs one ``[n_heads, N]`` row per layer;
norm scales from light module pre-hooks), or the TransformerBridge with hooks on
``blocks.{l}.attn.hook_pattern`` (only the query row is kept) and the norm scales -- the
reference every fast path is tested against (``tests/test_fast_decode.py``), used
whenever a hook is attached to the bridge or no twin exists. Values are read from the KV
cache (they equal ``hook_v``). A step makes one host read (the token id, which decides
stopping; a non-finite check is folded into it); rows, values and phi stay on the device.
Rows and values are aligned to absolute key positions on every layer: a sliding-window
layer's row covers only the last ``window`` keys, and its cache drops the oldest of them
during the step's update, so its values are the cache before the update plus the step's
new value (the authors' release indexes the window-sliced row with absolute positions;
docs/concepts.md). Memory is linear in context length: no ``N x N`` tensor is kept, and
the bridge's eager attention sees at most ``chunk_size x N`` scores at a time (SDPA
twin: one causal call, linear memory).

Decoding step ``t`` is the forward position whose logits choose ``y_t``: step 1 is the
last prompt token with ``N`` keys, step ``t`` has ``N + t - 1`` keys (docs/concepts.md).

The steps run in the package's one greedy loop (:func:`locos_tl.engine.greedy.greedy_loop`:
budget, argmax pick, non-finite check, forcing, stops), driven here by one forward per
engine. The stop and thinking rules live in :mod:`locos_tl.engine.stops` (with the
:class:`DecodeResult` they produce), the KV cache, prefill and step engines in
:mod:`locos_tl.engine.forward`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from locos_tl.engine.forward import (
    StepEngine,
    TwinScales,
    cache_values,
    hf_model,
    pre_step_values,
    prefill_with_rows,
    sliding_layers,
    step_engine,
    step_values,
)
from locos_tl.engine.greedy import greedy_loop
from locos_tl.engine.kernel import phi_from_pattern
from locos_tl.engine.options import DecodeOptions
from locos_tl.engine.prefix import PromptPrefix, prefill_from, trace_step
from locos_tl.engine.stops import DecodeResult, StopRules
from locos_tl.engine.teacher_forcing import cached_continuation_logprobs, prompt_ids
from locos_tl.engine.unembed import AnswerDirections
from locos_tl.errors import LocosError, TrialError

#: this module's names, and the :class:`DecodeResult` that :func:`greedy_decode` returns
__all__ = ["DecodeResult", "DecodeStep", "PaddedValues", "greedy_decode"]


@dataclass
class DecodeStep:
    """Everything detectors need about one decoding step (batch size 1).

    Attributes:
        t: 0-based index of the generated token this step chose.
        token: the greedy token ``y_t``.
        key_tokens: ids of the ``N_t`` key positions (prompt + earlier generated tokens).
        pattern: attention rows of the query, ``[n_layers, n_heads, N_t]`` (float32,
            probability; zero-padded on the left for sliding-window layers).
        values: per layer, ``[N_t, n_kv_heads, d_head]`` values at absolute key
            positions (zeros before a sliding window, where the pattern is zero too).
        scales: norm ``hook_scale`` values at the query position (``exact`` variant),
            0-d device tensors (no host read).
        logits: the step's output logits, ``[d_vocab]``.
        thinking: this step's token belongs to a ``<think> ... </think>`` block (its
            markers included); such a step is never an answer step.
    """

    t: int
    token: int
    key_tokens: Tensor
    pattern: Float[Tensor, "n_layers n_heads pos"]
    values: Sequence[Tensor]
    scales: dict[str, Any]
    logits: Tensor
    thinking: bool = False
    _W_O: list[Tensor] = field(repr=False, default_factory=list)
    _directions: AnswerDirections | None = field(repr=False, default=None)
    _kv: list[Tensor] | None = field(repr=False, default=None)  # [n_kv, K_l, d_head]

    @property
    def n_keys(self) -> int:
        return int(self.pattern.shape[-1])

    @cached_property
    def phi(self) -> Float[Tensor, "n_layers n_heads pos"]:
        """LOCOS ``phi[l, h, j]`` for ``y_t`` (Eq. 2), logits, computed once per step."""
        if self._directions is None:
            raise RuntimeError("this step was captured without answer directions")
        u = self._directions(self.token, self.scales)
        if self._kv is not None:
            return _phi_all_layers(self.pattern, self._kv, self._W_O, u)
        out = []
        for layer, v in enumerate(self.values):
            # under a device_map split each layer's values and W_O live on that layer's
            # device: compute there, gather the [n_heads, pos] result on pattern's device
            dev = v.device
            phi = phi_from_pattern(self.pattern[layer].to(dev), v,
                                   self._W_O[layer].to(dev), u[layer].to(dev))
            out.append(phi.to(self.pattern.device))
        return torch.stack(out)


class PaddedValues(Sequence[Tensor]):
    """``DecodeStep.values`` without copies: layer ``l``'s ``[n_keys, n_kv, d_head]``
    values at absolute positions, built (zeros before a sliding window) only when read.

    Args:
        kv: per layer, the ``[n_kv, K_l, d_head]`` values of the last ``K_l <= n_keys``
            keys (views of the KV cache).
        n_keys: the step's key positions ``N_t``.
    """

    def __init__(self, kv: list[Tensor], n_keys: int) -> None:
        self._kv, self._n = kv, n_keys

    def __len__(self) -> int:
        return len(self._kv)

    def __getitem__(self, layer: int) -> Tensor:  # type: ignore[override]
        v = self._kv[layer].transpose(0, 1)  # [K, n_kv, d_head]
        if v.shape[0] == self._n:
            return v
        return torch.cat([v.new_zeros(self._n - v.shape[0], *v.shape[1:]), v])


def _phi_all_layers(
    pattern: Float[Tensor, "n_layers n_heads pos"],
    kv: list[Tensor],
    W_O: list[Tensor],
    u: Float[Tensor, "n_layers d_model"],
) -> Float[Tensor, "n_layers n_heads pos"]:
    """Eq. 2 for every layer of one step: ``phi = alpha * (v . (W_O[h] @ u))``.

    ``kv[l]`` is the layer's ``[n_kv, K_l, d_head]`` values of its last ``K_l`` keys (a
    view of the KV cache, never copied); products run in the values' dtype (float32
    accumulation), as :func:`locos_tl.engine.kernel.phi_from_pattern` in float32. A layer
    whose window is shorter than the row is zero before it, as its pattern is.
    """
    L, H, n = pattern.shape
    vws = []
    for l, v in enumerate(kv):
        W = W_O[l]  # [H, d_head, d_model]
        ul = u[l]
        if ul.device != W.device or ul.dtype != W.dtype:
            ul = ul.to(W.device, W.dtype)
        w = torch.mv(W.reshape(-1, W.shape[-1]), ul)  # [H * d_head] (a view of W_O: no copy)
        if w.device != v.device:
            w = w.to(v.device)
        n_kv = v.shape[0]
        vw = torch.bmm(w.view(n_kv, H // n_kv, -1), v.transpose(-1, -2))  # [kv, g, K]
        if vw.device != pattern.device:
            vw = vw.to(pattern.device)
        vws.append(vw.view(H, -1))
    if all(x.shape[-1] == n for x in vws):
        vw_all = torch.stack(vws)
        if vw_all.dtype != torch.float32:
            vw_all = vw_all.to(torch.float32)
    else:
        vw_all = pattern.new_zeros(L, H, n)
        for l, x in enumerate(vws):
            vw_all[l, :, n - x.shape[-1] :] = x
    return pattern * vw_all


def _assemble(
    attn: Sequence[Tensor], cache: Any, before: Sequence[Tensor | None], n_keys: int
) -> tuple[Tensor, list[Tensor]]:
    """One step's ``[n_layers, n_heads, n_keys]`` float32 pattern at absolute key
    positions (zeros before a sliding window), and per layer the ``[n_kv, K_l, d_head]``
    values of the ``K_l`` keys its row covers (views of the cache; a sliding layer's are
    its pre-step cache plus the step's new value).

    Raises:
        LocosError: a row longer than the keys, or a cache whose values cannot be aligned.
    """
    kv = []
    for l, row in enumerate(attn):
        if row.shape[-1] > n_keys:
            raise LocosError(f"layer {l}: attention row of {row.shape[-1]} keys for "
                             f"{n_keys} key positions")
        after = cache_values(cache, l)
        if after is None:
            raise LocosError(f"layer {l}: the KV cache holds no values after the step")
        kv.append(step_values(before[l], after, row.shape[-1], l))
    if all(r.shape[-1] == n_keys for r in attn):
        pattern = torch.stack(list(attn))
        if pattern.dtype != torch.float32:
            pattern = pattern.to(torch.float32)
    else:
        pattern = attn[0].new_zeros(len(attn), attn[0].shape[0], n_keys, dtype=torch.float32)
        for l, row in enumerate(attn):
            pattern[l, :, n_keys - row.shape[-1] :] = row
    return pattern, kv


def greedy_decode(
    model: Any,
    tokens: Any,  # Sequence[int] | Tensor; checked by prompt_ids (clear TrialError)
    options: DecodeOptions | None = None,
    *,
    on_step: Callable[[DecodeStep], None] | None = None,
    directions: AnswerDirections | None = None,
    forced_tokens: Sequence[int] | None = None,
    prompt_window: int = 0,
    on_prompt_rows: Callable[[int, Tensor], None] | None = None,
    score_continuations: Sequence[Sequence[int]] | None = None,
    prefix: PromptPrefix | None = None,
    **decode: Any,
) -> DecodeResult:
    """Free greedy decoding, calling ``on_step`` at every step.

    Args:
        model: a TransformerBridge (batch size 1).
        tokens: prompt ids, length ``N >= 1``.
        options: how to decode (:class:`~locos_tl.engine.options.DecodeOptions`:
            ``max_new_tokens``, ``stop_rule``, ``thinking``, ``stop_at_eos``,
            ``prefill_mode``, ``chunk_size``, ``decode_engine``); None: the defaults.
        **decode: any field of :class:`~locos_tl.engine.options.DecodeOptions` as a
            keyword (``max_new_tokens=8``, ``stop_rule="none"``, ...), overriding
            ``options``. ``thinking=True`` (default) skips a ``<think> ... </think>``
            block (Qwen3 style, tokens found by text,
            :func:`locos_tl.engine.answers.think_token_ids`; a block left open by the
            prompt counts): newlines inside it and whitespace-only tokens right after
            it never stop, and its text is kept out of the response (docs/concepts.md,
            authors' release); ``False``: thinking tokens are ordinary tokens.
        on_step: called with a :class:`DecodeStep` (pattern rows, values, ``y_t``) per step.
        directions: answer directions for ``DecodeStep.phi``; needed only by phi users.
        forced_tokens: teacher forcing: step ``t`` takes ``forced_tokens[t]`` instead of
            the argmax (decoding ends when they run out).
        prompt_window: with ``on_prompt_rows``, read the attention rows of the last
            ``prompt_window`` prompt positions (the HeadKV anchor variant): see
            :func:`prefill_with_rows`. The row of the last prompt position is step 0's
            ``DecodeStep.pattern``.
        on_prompt_rows: called once per layer with that layer's rows of the positions
            ``N - prompt_window .. N - 2``, ``[n_heads, rows, N - 1]``.
        decode_engine: ``"auto"`` (default: the eager twin, or with no ``on_step`` the
            SDPA twin, when it runs every attached hook; else the bridge, see
            :func:`step_engine`), ``"twin"`` or ``"bridge"`` (the TransformerBridge with
            ``hook_pattern`` hooks: the reference).
        score_continuations: token-id sequences (say a target's and each distractor's
            name) whose teacher-forced log-probability right after the prompt is read
            from the prefill's KV cache before decoding (a copy of it: decoding is
            unchanged), on the same engine and under the same hooks as the decoding:
            no second prompt forward. In ``DecodeResult.continuation_logprobs``.
        prefix: the unablated prefill of the same prompt without its last token
            (:func:`locos_tl.engine.prefix.capture_prefix`): the prompt is then computed
            from the lowest layer the open interventions touch
            (:func:`locos_tl.engine.prefix.prefill_from`), the same cache as a full
            prefill. Ignored (a full prefill) when it cannot be exact: other tokens, a
            hook the twin cannot run, ``prefill_mode`` other than ``"auto"``, a
            ``chunk_size`` shorter than the prompt, attention rows asked for
            (``on_prompt_rows``), or that layer's ``resid_pre`` not kept. With a
            ``prefix.trace`` (:func:`locos_tl.engine.prefix.trace_decode`), each step
            whose tokens so far are the unablated decoding's also starts at that layer
            (:func:`locos_tl.engine.prefix.trace_step`; SDPA-twin steps, no
            ``forced_tokens``): the same logits as the full step.

    Returns:
        The generated ids (the stop token included), the decoded response text (stop
        token and thinking excluded, stripped), and where the response starts.

    Raises:
        TypeError: a keyword that is neither an argument nor a field of
            :class:`~locos_tl.engine.options.DecodeOptions` (a near miss is named).
        ValueError: unknown ``stop_rule``, ``prefill_mode`` or ``decode_engine``;
            ``"twin"`` impossible; ``max_new_tokens`` not an integer >= 1.
        TrialError: ``tokens`` is not a sequence or tensor of integer ids (a string, a
            float: the message says which); empty prompt; prompt + ``max_new_tokens``
            (or + a continuation) longer than ``n_ctx``; an empty continuation.
        NonFiniteError: a step's logits hold NaN or inf (a :class:`TrialError`).
    """
    opts = DecodeOptions.from_kwargs(options, where="greedy_decode", **decode)
    max_new_tokens, chunk_size = opts.max_new_tokens, opts.chunk_size
    ids = prompt_ids(tokens)
    N = ids.shape[1]
    if N == 0:
        raise TrialError("empty prompt")
    n_ctx = getattr(model.cfg, "n_ctx", None)
    if n_ctx and N + max_new_tokens - 1 > n_ctx:  # the last new token is never fed
        raise TrialError(
            f"prompt of {N} tokens + {max_new_tokens} new tokens exceeds the model's "
            f"context n_ctx={n_ctx}"
        )
    rules = StopRules.of(model, opts.stop_rule, opts.thinking, stop_at_eos=opts.stop_at_eos)
    ids = ids.to(next(hf_model(model).parameters()).device)
    eng = step_engine(model, opts.decode_engine, rows=on_step is not None)
    with torch.no_grad():
        cache = None
        if prefix is not None and on_prompt_rows is None and opts.prefill_mode == "auto":
            cache = prefill_from(model, prefix, ids[:, :-1], chunk_size=chunk_size)
        # the prompt came from the prefix: steps that generate the unablated tokens can
        # start at the lowest ablated layer too (prefix.trace)
        follow = (cache is not None and prefix is not None and prefix.trace is not None
                  and forced_tokens is None and eng.path == "sdpa_twin")
        if cache is None:
            cache = prefill_with_rows(
                model, ids[:, :-1],
                min(max(prompt_window - 1, 0), N - 1) if on_prompt_rows is not None else 0,
                on_prompt_rows, mode=opts.prefill_mode, chunk_size=chunk_size)
        scored = (cached_continuation_logprobs(model, eng, cache, ids[0, -1],
                                               score_continuations)
                  if score_continuations is not None else None)
        n_steps = (max_new_tokens if forced_tokens is None
                   else min(max_new_tokens, len(forced_tokens)))
        steps = _Steps(model, eng, cache, ids[0], n_steps, on_step=on_step,
                       directions=directions, prefix=prefix if follow else None)
        try:
            row = greedy_loop(steps, [ids[0]], rules, max_new_tokens=max_new_tokens,
                              forced_tokens=forced_tokens, on_token=steps.on_token)[0]
        finally:
            steps.close()
    result = row.result
    assert result is not None  # non_finite="raise": every row has its result
    result.continuation_logprobs = scored
    return result


class _Steps:
    """:func:`greedy_decode`'s forward (:class:`locos_tl.engine.greedy.GreedyForward`,
    batch size 1) on the engine ``eng`` picked, and its ``on_token``: the step's
    :class:`DecodeStep` for ``on_step`` and the key ids."""

    def __init__(self, model: Any, eng: StepEngine, cache: Any, prompt: Tensor,
                 max_new_tokens: int, *, on_step: Callable[[DecodeStep], None] | None,
                 directions: AnswerDirections | None, prefix: PromptPrefix | None) -> None:
        self.model, self.eng, self.cache, self.on_step = model, eng, cache, on_step
        self.directions, self.prefix = directions, prefix
        self.follow = prefix is not None  # steps on the unablated tokens start at prefix
        self.N = N = int(prompt.shape[0])
        self.n_layers = n_layers = int(model.cfg.n_layers)
        self.W_O = [model.blocks[l].attn.W_O.detach() for l in range(n_layers)]  # views
        self.keys = prompt.new_zeros(N + max_new_tokens)  # key ids; step t reads keys[:N+t]
        self.keys[:N] = prompt
        self.sliding = sliding_layers(cache, n_layers)
        scale_hooks = directions.hook_names() if directions is not None else []
        self.twin_scales = (TwinScales(model, eng.twin, scale_hooks)
                            if eng.path == "eager_twin" else None)
        self.rows: dict[int, Tensor] = {}  # the bridge's hook_pattern rows of the step
        self.scales: dict[str, Tensor] = {}
        self.fwd_hooks = [(f"blocks.{l}.attn.hook_pattern", self._keep_row)
                          for l in range(n_layers)]
        self.fwd_hooks += [(name, self._keep_scale) for name in scale_hooks]
        self.run = {"eager_twin": self._eager_twin, "sdpa_twin": self._sdpa_twin,
                    "bridge": self._bridge}[eng.path]
        # the current step's logits [d_vocab], rows, scales and pre-step sliding values
        self.logits: Tensor | None = None
        self.attn: Sequence[Tensor] = ()
        self.step_scales: dict[str, Any] = {}
        self.before: list[Tensor | None] = []

    def _keep_row(self, pattern: Tensor, hook: Any) -> None:
        self.rows[int(hook.name.split(".")[1])] = pattern[0, :, -1, :].detach()

    def _keep_scale(self, scale: Tensor, hook: Any) -> None:  # stays on the device
        self.scales[hook.name] = scale.reshape(scale.shape[0], scale.shape[1], -1)[0, -1, 0]

    def __call__(self, t: int, rows: list[int], last: list[int] | None) -> Tensor:
        n_keys = self.N + t
        step_input = self.keys[n_keys - 1 : n_keys].view(1, 1)
        # only a sliding layer's pre-step values are needed (and small); a full layer's
        # old cache is never kept alive past its update
        self.before = pre_step_values(self.cache, self.sliding)
        self.logits = self.run(t, step_input)
        return self.logits[None]

    def _eager_twin(self, t: int, step_input: Tensor) -> Tensor:
        out = self.eng.twin(step_input, past_key_values=self.cache,  # type: ignore[misc]
                            use_cache=True, output_attentions=True, logits_to_keep=1)
        self.attn = [a.reshape(a.shape[1], a.shape[-1]) for a in out.attentions]
        self.step_scales = ({k: v[0] for k, v in self.twin_scales.values.items()}
                            if self.twin_scales is not None else {})
        return out.logits[0, -1]

    def _sdpa_twin(self, t: int, step_input: Tensor) -> Tensor:
        reused = (trace_step(self.model, self.prefix, self.cache, t, step_input)
                  if self.follow and self.prefix is not None else None)
        self.follow = reused is not None
        if reused is not None:
            return reused
        return self.eng.twin(step_input, past_key_values=self.cache,  # type: ignore[misc]
                             use_cache=True, logits_to_keep=1).logits[0, -1]

    def _bridge(self, t: int, step_input: Tensor) -> Tensor:
        self.rows.clear()
        self.scales.clear()
        logits = self.model.run_with_hooks(
            step_input, fwd_hooks=self.fwd_hooks if self.on_step is not None else [],
            past_key_values=self.cache, use_cache=True, return_type="logits")[0, -1]
        self.attn = ([self.rows[l] for l in range(self.n_layers)]
                     if self.on_step is not None else ())
        self.step_scales = dict(self.scales)
        return logits

    def on_token(self, row: int, t: int, y: int, thinking: bool) -> None:
        n_keys = self.N + t
        self.follow = self.follow and y == self.prefix.trace.tokens[t]  # type: ignore[union-attr]
        if self.on_step is not None:
            pattern, kv = _assemble(self.attn, self.cache, self.before, n_keys)
            self.on_step(DecodeStep(
                t=t, token=y, key_tokens=self.keys[:n_keys], pattern=pattern,
                values=PaddedValues(kv, n_keys), scales=self.step_scales,
                logits=self.logits, thinking=thinking,  # type: ignore[arg-type]
                _W_O=self.W_O, _directions=self.directions, _kv=kv))
        if n_keys < self.keys.shape[0]:
            self.keys[n_keys] = y

    def close(self) -> None:
        if self.twin_scales is not None:
            self.twin_scales.remove()
