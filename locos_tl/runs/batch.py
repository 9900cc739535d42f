"""Batched trials: ``B`` trials decoded together on the model's plain HF twins.

:func:`run_trials_batched` returns, for each trial, exactly the record
:func:`locos_tl.runs.runner.run_trial` returns for it alone (same fields, same values to float
rounding), so run directories, resume and aggregation do not know whether a run was
batched. How a batch keeps every trial's numbers those of batch size 1:

- **Left padding, explicit positions.** The prompts are left-padded to the longest one,
  with an attention mask that hides the padding and position ids that count only a
  trial's own tokens (``0 .. N_b - 1``), so rotary phases, causal masks and needle
  spans are those of the trial alone. Every row ends at the same column, so all rows
  advance one token per step; a sliding window (``q - k < window``) is invariant to the
  common shift, and the padding it may cover is masked.
- **Prefill** on the SDPA twin (:mod:`locos_tl.engine.twin`), one causal call over the padded
  prompts (``chunk_size`` queries at a time when given). **Decode steps** on the eager
  twin (same tensors, ``output_attentions=True``): each row's attention row and values
  are cut to its own ``N_b + t`` key positions, right-aligned, before any detector sees
  them, with the sliding-window alignment of :func:`locos_tl.engine.decode.greedy_decode`
  (a window layer's row covers the last ``window`` keys; its values are the cache before
  the step plus the step's new value). Padding keys carry probability 0.
- **One host read per step**: the batch's greedy tokens (with a non-finite flag)
  in one ``tolist``; detector values stay on the device and move to the host once per
  trial.
- **Early stops do not stall the batch**: a row that stops (newline, EOS, non-finite
  logits) is dropped from the batch and the KV cache (``Cache.batch_select_indices``);
  the others keep decoding.
- **The same loop as batch size 1**: the pick, the stops and the non-finite check are
  :func:`locos_tl.engine.greedy.greedy_loop`'s, driven by the batch's own forward.

Batching needs both twins and no hook on the model: with a hook attached (a user's
TransformerLens hook or an :func:`locos_tl.engine.interventions.intervene` block), with
``prefill_mode="bridge"`` or ``decode_engine="bridge"``, or when a twin cannot be
built, it falls back to batch size 1 (:func:`locos_tl.runs.runner.run_trial`, where such a
hook fires) with a ``RuntimeWarning`` naming the reason. Equality with batch size 1 (every
method's per-trial scores within 1e-5 in float32, generated tokens and responses
identical, early stops, sliding windows shorter than the prompt) is tested on Qwen3,
Gemma-3, OLMo-2 and Llama in ``tests/test_batch.py``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from locos_tl.detectors import Detector
from locos_tl.engine.answers import GATE_THRESHOLD
from locos_tl.engine.decode import DecodeStep, PaddedValues
from locos_tl.engine.forward import (
    TwinScales,
    aligned_values,
    cache_values,
    new_cache,
    pre_step_values,
    prefill_with_rows,
    sliding_layers,
)
from locos_tl.engine.greedy import GreedyRow, greedy_loop
from locos_tl.engine.options import DecodeOptions
from locos_tl.engine.stops import StopRules
from locos_tl.engine.unembed import AnswerDirections
from locos_tl.errors import TrialError, warn_caller
from locos_tl.runs.trial import _Collector, non_finite_record, run_trial, trial_record
from locos_tl.trials import Trial

__all__ = ["batch_fallback_reason", "run_trials_batched"]


def batch_fallback_reason(
    model: Any, prefill_mode: str = "auto", decode_engine: str = "auto"
) -> str | None:
    """Why ``model`` cannot decode trials in batches (None: it can).

    Batches run on the plain HF twins (:mod:`locos_tl.engine.twin`), which fire no
    TransformerLens hook: any hook attached to the bridge (a user's, or an open
    :func:`locos_tl.engine.interventions.intervene` block's), ``prefill_mode="bridge"`` or
    ``decode_engine="bridge"``, or a missing SDPA/eager twin routes every trial through
    the bridge one at a time instead.
    """
    from locos_tl.engine.interventions import lens_hooks_attached
    from locos_tl.engine.twin import twin_info

    if prefill_mode == "bridge":
        return "prefill_mode='bridge' asks for the TransformerBridge path"
    if decode_engine == "bridge":
        return "decode_engine='bridge' asks for the TransformerBridge path"
    if lens_hooks_attached(model):
        return "a TransformerLens hook is attached to the model (it fires only on the bridge)"
    for kind in ("sdpa", "eager"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            info = twin_info(model, kind)
        if info.twin is None:
            return f"no {kind} twin ({info.reason})"
    return None


@dataclass
class _Row:
    """One trial of the batch; its decoding state is the greedy loop's
    (:class:`locos_tl.engine.greedy.GreedyRow`). At step ``t`` it has ``n + t`` keys."""

    index: int  # position in the caller's trial list
    trial: Trial
    ids: Tensor  # [N] prompt ids on the device
    on_step: Callable[[DecodeStep], None]
    keys: Tensor  # [N + max_new_tokens] key ids, as in greedy_decode: the first n + t set

    @property
    def n(self) -> int:
        return int(self.ids.shape[0])


@torch.no_grad()
def _decode_batch(
    model: Any,
    rows: list[_Row],
    *,
    max_new_tokens: int,
    directions: AnswerDirections | None,
    rules: StopRules,
    chunk_size: int | None,
    prompt_window: int,
    on_prompt_rows: dict[int, Callable[[int, Tensor], None]] | None,
    on_done: Callable[[_Row, GreedyRow], None],
) -> None:
    """Decode ``rows`` together (module docstring); ``on_done(row, decoding)`` as each
    one stops."""
    from locos_tl.engine.twin import twin_info

    eager = twin_info(model, "eager").twin
    device = rows[0].ids.device
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    W_O = [model.blocks[l].attn.W_O.detach() for l in range(n_layers)]
    B = len(rows)
    T = max(r.n for r in rows)
    mask = torch.zeros(B, T - 1, dtype=torch.long, device=device)  # the cached keys
    for b, r in enumerate(rows):
        mask[b, T - r.n:] = 1  # left padding is masked
    cache = new_cache(model)

    # each prompt (but its last token) is prefilled alone, exactly as at batch size 1
    # (:func:`locos_tl.engine.forward.prefill_with_rows`: SDPA twin, prompt rows for the HeadKV
    # anchor), then the caches are left-padded with zeros (masked) into one batch cache,
    # layer by layer; a sliding-window layer keeps its last ``window - 1`` keys and
    # counts the padded length. Padding in the prefill would change float rounding.
    P = T - 1
    caches = []
    for r in rows:
        n_rows = min(max(prompt_window - 1, 0), r.n - 1) if on_prompt_rows is not None else 0
        caches.append(prefill_with_rows(
            model, r.ids[None, :-1], n_rows,
            on_prompt_rows[r.index] if on_prompt_rows is not None else None,
            mode="sdpa", chunk_size=chunk_size))
    for l, layer in enumerate(cache.layers if P else ()):
        parts = [(cache_values(c, l), getattr(c.layers[l], "keys", None)) for c in caches]
        ref = next((v for v, _ in parts if v is not None), None)
        if ref is None:
            continue
        width = max(v.shape[-2] for v, _ in parts if v is not None)
        keys = ref.new_zeros(B, ref.shape[1], width, ref.shape[-1])
        vals = torch.zeros_like(keys)
        for b, (v, k) in enumerate(parts):
            if v is not None and v.shape[-2]:
                keys[b, :, width - k.shape[-2]:] = k[0]
                vals[b, :, width - v.shape[-2]:] = v[0]
        for c in caches:  # free each trial's layer as soon as it is copied
            c.layers[l].keys = c.layers[l].values = None
        layer.update(keys, vals)
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length = P
    del caches

    scales = TwinScales(model, eager,
                        directions.hook_names() if directions is not None else [])
    sliding = sliding_layers(cache, n_layers)
    current = list(range(B))  # the rows in the batch (and the cache), in order
    step: dict[str, Any] = {}  # the last step's rows, values and logits

    def forward(t: int, active: list[int], last: list[int] | None) -> Tensor:
        nonlocal mask, current
        if active != current:  # rows stopped: drop them from the batch and the KV cache
            sel = torch.as_tensor([current.index(i) for i in active], device=device)
            cache.batch_select_indices(sel)
            mask = mask[sel]
            current = active
        # each row's last prompt token, then its last token, at its own position (padding
        # is not counted); each step appends its own mask column
        step_input = (torch.stack([r.ids[-1:] for r in rows]) if last is None
                      else torch.as_tensor([[y] for y in last], device=device))
        step_pos = torch.as_tensor([[rows[i].n + t - 1] for i in active], device=device)
        mask = torch.cat([mask, mask.new_ones(len(active), 1)], dim=1)
        # only a sliding layer's pre-step values are needed (and small); a full layer's
        # old cache is never kept alive past its update (as in greedy_decode)
        before = pre_step_values(cache, sliding)
        out = eager(step_input, attention_mask=mask, position_ids=step_pos,
                    past_key_values=cache, use_cache=True, output_attentions=True,
                    logits_to_keep=1)
        logits = out.logits[:, -1]  # [B, d_vocab]
        rows_l = [a[:, :, -1, :].to(torch.float32) for a in out.attentions]  # [B, H, K_l]
        step.update(
            logits=logits, rows_l=rows_l, batch={i: b for b, i in enumerate(active)},
            # [L, B, H, K] when no layer has a shorter window
            stacked=torch.stack(rows_l) if len({x.shape[-1] for x in rows_l}) == 1 else None,
            vals_l=[aligned_values(before[l], cache_values(cache, l), rows_l[l].shape[-1], l)
                    for l in range(n_layers)])  # [B, n_kv, K_l, d_head]
        return logits

    def on_token(i: int, t: int, y: int, thinking: bool) -> None:
        r, b = rows[i], step["batch"][i]
        n_keys = r.n + t
        stacked, rows_l = step["stacked"], step["rows_l"]
        if stacked is not None and stacked.shape[-1] >= n_keys:  # a view, no copy
            pattern = stacked[:, b, :, stacked.shape[-1] - n_keys:]
        else:
            pattern = torch.zeros(n_layers, n_heads, n_keys, device=device)
            for l in range(n_layers):
                row = rows_l[l][b]  # [H, K_l]
                k = min(row.shape[-1], n_keys)
                pattern[l, :, n_keys - k:] = row[:, row.shape[-1] - k:]
        kv = [v[b, :, max(v.shape[-2] - n_keys, 0):] for v in step["vals_l"]]  # [n_kv, k, d]
        r.on_step(DecodeStep(
            t=t, token=y, key_tokens=r.keys[:n_keys], pattern=pattern,
            values=PaddedValues(kv, n_keys),
            scales={k_: v_[b] for k_, v_ in scales.values.items()}, logits=step["logits"][b],
            thinking=thinking, _W_O=W_O, _directions=directions, _kv=kv))
        if n_keys < r.keys.shape[0]:
            r.keys[n_keys] = y

    try:
        greedy_loop(forward, [r.ids for r in rows], rules, max_new_tokens=max_new_tokens,
                    on_token=on_token, on_done=lambda i, g: on_done(rows[i], g),
                    non_finite="drop")
    finally:
        scales.remove()


def run_trials_batched(
    model: Any,
    trials: Sequence[Trial],
    detectors: Sequence[Detector],
    *,
    directions: AnswerDirections | None,
    decode: DecodeOptions | None = None,
    batch_size: int = 8,
    gate_threshold: float = GATE_THRESHOLD,
    on_record: Callable[[int, dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Score ``trials`` ``batch_size`` at a time; the records of :func:`run_trial`.

    Trials are grouped by prompt length (less padding) into batches of ``batch_size``;
    each batch is prefilled once and decoded together, each trial stopping by its own
    rule (module docstring). Arguments as for :func:`locos_tl.runs.runner.run_trial`
    (``directions`` is needed by phi-based detectors; ``decode``'s ``prefill_mode`` or
    ``decode_engine`` ``"bridge"`` falls back to batch size 1; its ``stop_at_eos`` is
    the batch's stop rule too).

    Args:
        model: a TransformerBridge.
        trials: the trials (already validated, :func:`locos_tl.experiments.score.check_trials_fit`).
        detectors: the detectors sharing the pass.
        batch_size: trials per batch (``>= 1``).
        on_record: called with ``(index in trials, record)`` as soon as a trial's record
            is made (e.g. to append it to a run directory).

    Returns:
        One record per trial, in the order of ``trials``; equal to
        :func:`locos_tl.runs.runner.run_trial`'s (per-trial scores within float rounding,
        1e-5 in float32; tokens and responses identical).

    Raises:
        ValueError: ``batch_size < 1``.
        TrialError: an empty prompt.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    decode = DecodeOptions() if decode is None else decode
    max_new_tokens, chunk_size = decode.max_new_tokens, decode.chunk_size
    rules = StopRules.of(model, decode.stop_rule, decode.thinking,
                         stop_at_eos=decode.stop_at_eos)
    trials = list(trials)
    out: list[dict[str, Any] | None] = [None] * len(trials)

    def done(i: int, rec: dict[str, Any]) -> None:
        out[i] = rec
        if on_record is not None:
            on_record(i, rec)

    reason = (batch_fallback_reason(model, decode.prefill_mode, decode.decode_engine)
              if batch_size > 1 else "batch_size=1")
    if reason is not None:
        if batch_size > 1:
            warn_caller(f"batch_size={batch_size} falls back to batch size 1: {reason}",
                        RuntimeWarning)
        for i, trial in enumerate(trials):
            done(i, run_trial(model, trial, detectors, directions=directions, decode=decode,
                              gate_threshold=gate_threshold))
        return out  # type: ignore[return-value]

    device = next(model.original_model.parameters()).device
    window = max((d.prompt_window for d in detectors), default=0)
    order = sorted(range(len(trials)), key=lambda i: trials[i].n_tokens)
    for s in range(0, len(order), batch_size):
        chunk = order[s:s + batch_size]
        cols: dict[int, _Collector] = {}
        rows = []
        for i in chunk:
            trial = trials[i]
            if trial.n_tokens == 0:
                raise TrialError(f"trial {trial.trial_id}: empty prompt")
            prompt = torch.as_tensor(trial.tokens, dtype=torch.long, device=device)
            cols[i] = _Collector(trial, detectors)
            rows.append(_Row(index=i, trial=trial, ids=prompt, on_step=cols[i].on_step,
                             keys=torch.cat([prompt, prompt.new_zeros(max_new_tokens)])))

        def finished(r: _Row, dec: GreedyRow, cols_: dict[int, _Collector] = cols) -> None:
            if dec.non_finite is not None or dec.result is None:
                rec = non_finite_record(r.trial, str(dec.non_finite), detectors)
            else:
                rec = trial_record(model, r.trial, detectors, dec.result, cols_[r.index],
                                   gate_threshold)
            done(r.index, rec)

        prompt_cbs = ({i: c.on_prompt_rows for i, c in cols.items()} if window else None)
        _decode_batch(model, rows, max_new_tokens=max_new_tokens, directions=directions,
                      rules=rules, chunk_size=chunk_size,
                      prompt_window=window, on_prompt_rows=prompt_cbs,
                      on_done=finished)
    return out  # type: ignore[return-value]
