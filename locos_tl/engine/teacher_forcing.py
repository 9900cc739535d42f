"""Teacher-forced log-probabilities after a prompt, with no decoding.

The prompt is prefilled once (from its lowest intervened layer when a
:class:`~locos_tl.engine.prefix.PromptPrefix` of the same prompt is given), then each
continuation runs as one short forward on a fork of that cache. These are the numbers
:func:`locos_tl.engine.decode.greedy_decode` reports as ``continuation_logprobs``
(``score_continuations=``): the same prefill, the same engine, the same forwards, so the
two agree bit for bit. Without the decoding they cost one prompt forward and one forward
per continuation: the cheap path of an ablation sweep that needs log-probabilities and
name margins but no generated text (:mod:`locos_tl.experiments.teacher_forced`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from locos_tl.engine.continuations import check_continuations, continuation_logprob
from locos_tl.engine.forward import fork_cache, prefill, step_engine
from locos_tl.engine.prefix import PromptPrefix, prefill_from
from locos_tl.errors import TrialError

__all__ = ["cached_continuation_logprobs", "continuation_logprobs", "prompt_ids"]


def prompt_ids(tokens: Any) -> Tensor:
    """``tokens`` (ids, or an integer tensor of shape ``[N]`` or ``[1, N]``) as ``[1, N]``
    long.

    Raises:
        TrialError: a string (not tokenized), a float or bool tensor, or anything that is
            not a sequence of integer ids (:func:`locos_tl.trials.as_token_ids`)."""
    if isinstance(tokens, Tensor):
        dt = tokens.dtype
        if dt.is_floating_point or dt.is_complex or dt == torch.bool:
            raise TrialError(f"tokens must be integer token ids, got a {dt} tensor")
        return tokens.to(torch.long).reshape(1, -1)
    from locos_tl.trials import as_token_ids

    return torch.tensor([as_token_ids(tokens, "tokens")], dtype=torch.long).reshape(1, -1)


def cached_continuation_logprobs(model: Any, eng: Any, cache: Any, last_id: Tensor,
                                 continuations: Sequence[Sequence[int]]) -> list[float]:
    """Teacher-forced log-probabilities (nats) of ``continuations`` after a prompt
    whose first ``N - 1`` tokens are in ``cache`` and whose last token is ``last_id``:
    one batch-1 forward of ``[last_id, *c[:-1]]`` per continuation on a fork of the
    cache (:func:`fork_cache`: no tensor copied), through ``eng``
    (:func:`locos_tl.engine.forward.step_engine`).

    Raises:
        TrialError: an empty continuation; prompt plus continuation longer than
            ``n_ctx``.
    """
    conts = [[int(x) for x in c] for c in continuations]
    check_continuations(model, int(cache.get_seq_length()) + 1, conts)
    out = []
    for c in conts:
        step = torch.tensor([[int(last_id), *c[:-1]]], device=last_id.device)
        kv = fork_cache(model, cache)
        if eng.path in ("eager_twin", "sdpa_twin"):
            logits = eng.twin(step, past_key_values=kv, use_cache=True).logits[0]
        else:
            logits = model.run_with_hooks(step, fwd_hooks=[], past_key_values=kv,
                                          use_cache=True, return_type="logits")[0]
        out.append(float(continuation_logprob(logits, c)))
    return out


@torch.no_grad()
def continuation_logprobs(
    model: Any,
    tokens: Any,
    continuations: Sequence[Sequence[int]],
    *,
    prefix: PromptPrefix | None = None,
    chunk_size: int | None = None,
) -> list[float]:
    """Log-probability (nats, summed over tokens) of each continuation right after the
    prompt ``tokens``, under the interventions open now (say inside
    :func:`locos_tl.ablate`), with no decoding.

    Equal, bit for bit, to ``greedy_decode(model, tokens,
    score_continuations=continuations, prefix=prefix,
    chunk_size=chunk_size).continuation_logprobs``.

    Args:
        model: a TransformerBridge (batch size 1).
        tokens: prompt ids, length ``N >= 1``.
        continuations: token-id sequences, each at least one token.
        prefix: the unablated prefill of the same prompt without its last token
            (:func:`locos_tl.engine.prefix.prompt_prefix`): the prompt is computed from
            the lowest intervened layer up. Ignored (a full prefill) where that cannot be
            exact (see :func:`locos_tl.engine.prefix.prefill_from`) or the prompt is
            longer than ``chunk_size``.
        chunk_size: prefill query chunk (see :func:`locos_tl.engine.forward.prefill`).

    Returns:
        One float per continuation, in order.

    Raises:
        TrialError: tokens that are not integer ids; an empty prompt; an empty
            continuation; prompt plus continuation longer than ``n_ctx``.
    """
    ids = prompt_ids(tokens)
    if ids.shape[1] == 0:
        raise TrialError("empty prompt")
    device = next(model.original_model.parameters()).device
    ids = ids.to(device)
    check_continuations(model, ids.shape[1], continuations)
    cache = (prefill_from(model, prefix, ids[:, :-1], chunk_size=chunk_size)
             if prefix is not None else None)
    if cache is None:
        cache = prefill(model, ids[:, :-1], chunk_size=chunk_size)
    eng = step_engine(model, "auto", rows=False)
    return cached_continuation_logprobs(model, eng, cache, ids[0, -1], continuations)
