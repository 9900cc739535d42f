"""Teacher-forced log-probabilities of token sequences that continue a prompt.

Shared by the decoding's scoring from its own prefill cache
(:func:`locos_tl.engine.decode.greedy_decode`, ``score_continuations``) and the
standalone batched forward (:func:`locos_tl.experiments.margin.name_logprobs`): the same
checks and the same sum of log-softmax entries, so the two paths differ only by the
forward that produced the logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from locos_tl.errors import TrialError

__all__ = ["check_continuations", "continuation_logprob"]


def check_continuations(model: Any, n_prompt: int, continuations: Sequence[Sequence[int]],
                        what: str = "continuation") -> None:
    """Refuse a continuation that cannot be scored after a prompt of ``n_prompt`` tokens.

    Raises:
        TrialError: an empty continuation; prompt plus continuation (its last token is
            never fed) longer than the model's ``cfg.n_ctx``.
    """
    if any(len(c) == 0 for c in continuations):
        raise TrialError(f"a {what} with no tokens has no log-probability")
    v = getattr(getattr(model, "cfg", None), "n_ctx", None)
    limit = int(v) if v else None
    longest = max((len(c) for c in continuations), default=0)
    if limit is not None and n_prompt + longest - 1 > limit:
        raise TrialError(f"prompt of {n_prompt} tokens + a {what} of {longest} tokens is "
                         f"longer than the model's context n_ctx={limit}")


def continuation_logprob(logits: Float[Tensor, "pos d_vocab"], ids: Sequence[int]) -> Tensor:
    """``sum_i log softmax(logits[i])[ids[i]]`` in float32 (nats): the log-probability of
    ``ids`` when row ``i`` of ``logits`` predicts ``ids[i]``."""
    logp = torch.log_softmax(logits[: len(ids)].float(), dim=-1)
    target = torch.tensor([int(x) for x in ids], device=logp.device)
    return logp[torch.arange(len(ids), device=logp.device), target].sum()
