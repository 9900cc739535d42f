"""The teacher-forced name margin of a distractor trial: does the model prefer the
target's name over every distractor's, at the answer position?

For a trial built with distractor needles (``locos build-trials nolima --distractors
N``), the margin is

    margin = log P(target name | prompt) - max_d log P(name_d | prompt)

in nats, each name's log-probability summed over its tokens, teacher-forced right after
the prompt (where the answer starts). It needs one batched forward pass (prompt + each
name, right-padded) and no decoding, and it is continuous: paired tests have power on
few trials where "contains" is 0 or 1. Inside :func:`locos_tl.ablate` it is the margin
of the ablated model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from locos_tl.engine.continuations import check_continuations, continuation_logprob
from locos_tl.errors import TrialError
from locos_tl.trials import Trial


def candidate_names(trial: Trial) -> tuple[str, list[str]]:
    """``(target name, distractor names)`` of a distractor trial.

    Raises:
        TrialError: the trial records no distractor names (``meta["distractor_names"]``).
    """
    rivals = list(trial.meta.get("distractor_names") or [])
    if not rivals:
        raise TrialError(f"trial {trial.trial_id} has no distractor names; build it with "
                         "`locos build-trials nolima --distractors N`")
    return str(trial.meta.get("character") or trial.answer), [str(r) for r in rivals]


def name_prefix(trial: Trial) -> str:
    """What precedes a name at the answer position: a space after the completion
    template (``"... The character's name is"``), nothing at the start of a chat turn."""
    return " " if trial.meta.get("template") == "completion" else ""


def name_token_ids(tokenizer: Any, name: str, prefix: str = "") -> list[int]:
    """The token ids of ``prefix + name`` (no special tokens).

    Raises:
        TrialError: the name tokenizes to nothing.
    """
    ids = list(tokenizer(prefix + name, add_special_tokens=False).input_ids)
    if not ids:
        raise TrialError(f"the name {name!r} tokenizes to nothing")
    return [int(i) for i in ids]


def _logits(model: Any, ids: Tensor) -> Tensor:
    """Logits of a batch, on the SDPA twin when it reproduces the attached hooks (the
    ablation's), else through the TransformerBridge."""
    from locos_tl.engine.interventions import engine
    from locos_tl.engine.twin import sdpa_twin

    with torch.no_grad():
        if engine(model) == "twin":
            return sdpa_twin(model)(input_ids=ids).logits
        return model(ids, return_type="logits")


def name_logprobs(
    model: Any, tokens: Sequence[int], names: Sequence[Sequence[int]]
) -> Float[Tensor, " n_names"]:
    """Teacher-forced log-probability (nats) of each token sequence in ``names`` right
    after the prompt ``tokens``: one forward pass over the batch ``prompt + name``
    (right-padded, so the prompt positions are those of a plain forward).

    Raises:
        TrialError: an empty name; prompt and name longer than the model's ``n_ctx``.
    """
    check_continuations(model, len(tokens), names, what="name")
    device = next(model.parameters()).device
    n_prompt, width = len(tokens), max(len(n) for n in names)
    pad = int(names[0][0])  # any id: right padding never reaches earlier positions
    batch = torch.full((len(names), n_prompt + width - 1), pad, dtype=torch.long)
    for i, n in enumerate(names):
        seq = list(tokens) + list(n[:-1])
        batch[i, : len(seq)] = torch.tensor(seq)
    logits = _logits(model, batch.to(device))
    return torch.stack([continuation_logprob(logits[i, n_prompt - 1:], n)
                        for i, n in enumerate(names)]).cpu()


def name_margin(model: Any, trial: Trial) -> dict[str, Any]:
    """The trial's name margin (module docstring; Gema, Alex & Minervini 2026 score
    distractor trials by contains; this is its continuous, teacher-forced companion).

    Returns:
        ``name_margin`` (nats: target minus the best distractor), ``logp_target``,
        ``logp_best_distractor`` and ``best_distractor`` (the name).

    Raises:
        TrialError: no distractor names; a name that tokenizes to nothing; prompt and
            name longer than the model's ``n_ctx``.
    """
    ids = candidate_token_ids(model.tokenizer, trial)
    return margin_of_logprobs(trial, name_logprobs(model, trial.tokens, ids))


def candidate_token_ids(tokenizer: Any, trial: Trial) -> list[list[int]]:
    """Token ids of the target's name, then each distractor's, as they would start the
    answer (:func:`name_prefix`).

    Raises:
        TrialError: no distractor names; a name that tokenizes to nothing.
    """
    target, rivals = candidate_names(trial)
    prefix = name_prefix(trial)
    return [name_token_ids(tokenizer, n, prefix) for n in [target, *rivals]]


def margin_of_logprobs(trial: Trial, logp: Sequence[float] | Tensor) -> dict[str, Any]:
    """:func:`name_margin`'s record from the log-probabilities (nats) of the names of
    :func:`candidate_token_ids`, computed elsewhere (say from a decoding's KV cache:
    ``greedy_decode(..., score_continuations=...)``)."""
    _, rivals = candidate_names(trial)
    logp = torch.as_tensor(logp, dtype=torch.float64)
    best = int(torch.argmax(logp[1:])) + 1
    return {"name_margin": float(logp[0] - logp[best]), "logp_target": float(logp[0]),
            "logp_best_distractor": float(logp[best]), "best_distractor": rivals[best - 1]}
