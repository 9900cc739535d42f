"""Greedy decoding through a compressed KV cache (query-agnostic context compression).

Protocol (one trial): the context ``[0, query_start)`` is prefilled with the normal full
cache (:func:`locos_tl.engine.forward.prefill`: the SDPA twin, or the bridge); the cache is
compressed per unit (:func:`locos_tl.experiments.compress.cache.compress_cache`: only the retained
entries are copied into the compressed cache, so memory really drops); the question
tokens ``[query_start, N)`` run through the compressed cache in one forward; greedy
decoding continues with the same cache (new tokens always kept), in the package's one
greedy loop (:func:`locos_tl.engine.greedy.greedy_loop`) with its stop rules
(:class:`locos_tl.engine.stops.StopRules`: newline token, EOS, thinking blocks).
Positions are explicit (``position_ids``), so RoPE sees the original absolute
positions.

With every unit full, the result equals :func:`locos_tl.engine.decode.greedy_decode` token for
token and its float32 logits up to summation order (``tests/test_compress_decode.py``:
about 1e-5 on logits of magnitude 10); in bf16 the kernels differ by rounding only,
which can flip a near-tie argmax.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from locos_tl.engine.greedy import check_max_new_tokens, greedy_loop
from locos_tl.engine.stops import StopRules
from locos_tl.errors import LocosError, TrialError
from locos_tl.experiments.compress.budgets import Budgets
from locos_tl.experiments.compress.cache import (
    CACHE_KWARG,
    CompressedCache,
    compress_cache,
    compression_twin,
)
from locos_tl.experiments.task_metrics import answer_word_match, first_token_match
from locos_tl.trials import Trial


@dataclass
class CompressedResult:
    """One compressed greedy decode.

    Attributes:
        tokens: generated ids (the stop token included).
        text: the response (stop token and thinking excluded, stripped).
        answer: the trial's gold answer.
        first_token: the first response token id (None when nothing was generated).
        answer_first_tokens: first token of each tokenization of the answer (with and
            without a leading space).
        retained_entries: retained context entries right after compression, counted
            per unit (per query head for ``unit="query_head"``); a sliding layer counts
            only the entries its full cache holds.
        full_entries: context entries of the full cache in the same units.
        kv_bytes: bytes of the stored compressed context K/V tensors (``nbytes``).
        full_kv_bytes: bytes of the full prefilled context cache's K/V tensors.
        query_start: first question position.
        stopped_by: ``"eos"``, ``"newline"`` or ``"max_new_tokens"``.
        logits: ``[n_steps, d_vocab]`` float32 logits of every step (step 0: the last
            question token), kept only with ``keep_logits=True``.
    """

    tokens: list[int]
    text: str
    answer: str
    first_token: int | None
    answer_first_tokens: tuple[int, ...]
    retained_entries: int
    full_entries: int
    kv_bytes: int
    full_kv_bytes: int
    query_start: int
    stopped_by: str
    logits: Tensor | None = field(default=None, repr=False)

    @property
    def retained_fraction(self) -> float:
        """``retained_entries / full_entries``."""
        return self.retained_entries / self.full_entries if self.full_entries else 1.0

    @property
    def first_token_correct(self) -> bool:
        """The first response token is a first token of the answer
        (:func:`~locos_tl.experiments.task_metrics.first_token_match`): the column
        ``correct``."""
        return first_token_match(self.first_token, self.answer_first_tokens)

    @property
    def answer_correct(self) -> bool:
        """The answer occurs in the response as a whole word, case-sensitive
        (:func:`~locos_tl.experiments.task_metrics.answer_word_match`; not NoLiMa's
        substring ``contains``): the column ``answer_correct``."""
        return answer_word_match(self.text, self.answer)


def query_start_of(trial: Trial, query_start: int | None = None) -> int:
    """The question's first position: ``query_start`` or ``trial.meta["query_start"]``
    (negative: counted from the end of the prompt).

    Raises:
        TrialError: neither given, or not inside ``[1, N - 1]``.
    """
    qs = query_start if query_start is not None else trial.meta.get("query_start")
    if qs is None:
        raise TrialError(
            "compressed decoding needs where the question starts: the trial's "
            "meta['query_start'] is missing (organism trials carry it); pass query_start=")
    qs = int(qs)
    if qs < 0:  # counted from the end of the prompt
        qs += trial.n_tokens
    if not 1 <= qs <= trial.n_tokens - 1:
        raise TrialError(f"query_start={qs} must lie in [1, {trial.n_tokens - 1}] for a "
                         f"prompt of {trial.n_tokens} tokens")
    return qs


def prefill_context(model: Any, trial: Trial, query_start: int) -> Any:
    """The full KV cache of the context ``trial.tokens[:query_start]``
    (:func:`locos_tl.engine.forward.prefill`)."""
    from locos_tl.engine.forward import prefill

    device = next(model.original_model.parameters()).device
    ids = torch.tensor([trial.tokens[:query_start]], dtype=torch.long, device=device)
    return prefill(model, ids)


def _answer_first_tokens(tok: Any, answer: str) -> tuple[int, ...]:
    from locos_tl.engine.answers import answer_token_variants

    return tuple(dict.fromkeys(v[0] for v in answer_token_variants(tok, answer)))


@torch.no_grad()
def decode_compressed(
    model: Any,
    trial: Trial,
    cache: CompressedCache,
    query_start: int,
    *,
    max_new_tokens: int = 8,
    stop_rule: str = "newline_token",
    thinking: bool = True,
    stop_at_eos: bool = True,
    keep_logits: bool = False,
) -> CompressedResult:
    """Run the question through ``cache`` and decode greedily (``cache`` is consumed).

    Raises:
        ValueError: ``max_new_tokens`` < 1 or an unknown stop rule.
        NonFiniteError: a step's logits hold NaN or inf.
    """
    check_max_new_tokens(max_new_tokens)
    rules = StopRules.of(model, stop_rule, thinking, stop_at_eos=stop_at_eos)
    twin = compression_twin(model)
    device = next(twin.parameters()).device
    ids = torch.tensor([trial.tokens], dtype=torch.long, device=device)
    N = ids.shape[1]
    all_logits: list[Tensor] = []

    def forward(t: int, rows: list[int], last: list[int] | None) -> Tensor:
        # step 0: the whole question, after it one token; at absolute positions
        step_in = ids[:, query_start:] if last is None else ids.new_tensor([last])
        pos = query_start if last is None else N + t - 1
        position_ids = torch.arange(pos, pos + step_in.shape[1], device=device)[None]
        logits = twin(step_in, past_key_values=cache, position_ids=position_ids,
                      use_cache=True, logits_to_keep=1, **{CACHE_KWARG: cache}).logits[0, -1]
        if keep_logits:
            all_logits.append(logits.float())
        return logits[None]

    res = greedy_loop(forward, [ids[0]], rules, max_new_tokens=max_new_tokens,
                      what="compressed decoding")[0].result
    assert res is not None  # non_finite="raise": the row has its result
    first = (res.generated[res.response_start]
             if res.response_start < len(res.generated) else None)
    return CompressedResult(
        tokens=res.generated, text=res.text, answer=trial.answer, first_token=first,
        answer_first_tokens=_answer_first_tokens(model.tokenizer, trial.answer),
        retained_entries=cache.retained_entries, full_entries=cache.full_entries,
        kv_bytes=cache.kv_bytes, full_kv_bytes=cache.full_kv_bytes,
        query_start=query_start, stopped_by=res.stopped_by,
        logits=torch.stack(all_logits) if keep_logits else None)


def n_heads_of(model: Any) -> tuple[int, int, int]:
    """``(n_layers, n_heads, n_kv_heads)`` from the bridge's config."""
    cfg = model.cfg
    n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    return int(cfg.n_layers), int(cfg.n_heads), int(n_kv)


@torch.no_grad()
def compressed_generate(
    model: Any,
    trial: Trial,
    budgets: Budgets,
    *,
    max_new_tokens: int = 8,
    query_start: int | None = None,
    stop_rule: str = "newline_token",
    thinking: bool = True,
    stop_at_eos: bool = True,
    keep_logits: bool = False,
    full_cache: Any = None,
) -> CompressedResult:
    """Greedy decoding of ``trial`` with its context KV cache compressed by ``budgets``.

    Args:
        model: a TransformerBridge (:func:`locos_tl.load_model`), batch size 1.
        trial: the trial; its question starts at ``query_start`` (or
            ``trial.meta["query_start"]``).
        budgets: :func:`~locos_tl.experiments.compress.kv_budgets` output with
            ``context_len == query_start``, the model's layer / kv-head counts and, on a
            model with sliding-window layers, ``capacity=context_capacity(model,
            query_start)``.
        max_new_tokens: at most this many generated tokens.
        query_start: the question's first position (default: from the trial's meta).
        stop_rule, thinking, stop_at_eos: as :func:`locos_tl.engine.decode.greedy_decode`.
        keep_logits: keep every step's logits in the result.
        full_cache: a prefilled full cache of the context to compress from (left
            intact; :func:`prefill_context`), to share one prefill among budgets.

    Returns:
        :class:`CompressedResult` (tokens, text, correctness, entries and bytes).

    Raises:
        TrialError: no ``query_start``; budgets for another context length or another
            layer / head count.
        LocosError: no HF twin can be built, or the model has learned attention sinks
            (both before any forward pass); hooks are attached to the bridge; budgets
            whose capacities differ from what the cache stores (sliding windows).
    """
    qs = query_start_of(trial, query_start)
    L, H, n_kv = n_heads_of(model)
    from locos_tl.engine.interventions import lens_hooks_attached

    if lens_hooks_attached(model):
        raise LocosError(
            "compressed decoding runs on its own HF twin of the model, where hooks "
            "attached to the TransformerBridge (an ablation, a user hook) would not run; "
            "remove them first")
    if budgets.context_len != qs:
        raise TrialError(f"the budgets are for a context of {budgets.context_len} tokens, "
                         f"the trial's question starts at {qs}")
    if (budgets.n_layers, budgets.n_heads, budgets.n_kv_heads) != (L, H, n_kv):
        raise TrialError(
            f"the budgets are for {budgets.n_layers} layers x {budgets.n_heads} heads / "
            f"{budgets.n_kv_heads} kv heads, the model has {L} x {H} / {n_kv}")
    compression_twin(model)  # refuses what it cannot run before the prefill
    full = full_cache if full_cache is not None else prefill_context(model, trial, qs)
    cache = compress_cache(full, budgets, H)
    return decode_compressed(model, trial, cache, qs, max_new_tokens=max_new_tokens,
                             stop_rule=stop_rule, thinking=thinking,
                             stop_at_eos=stop_at_eos, keep_logits=keep_logits)
