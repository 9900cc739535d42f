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

from locos_tl.engine.continuation_tokens import (  # noqa: F401  (trial_context re-exported)
    answer_prefix,
    continuation_token_ids,
    trial_context,
)
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
        raise TrialError(f"trial {trial.trial_id}: no distractor names; build it with "
                         "`locos build-trials nolima --distractors N`")
    return str(trial.meta.get("character") or trial.answer), [str(r) for r in rivals]


def name_prefix(trial: Trial) -> str:
    """What precedes a name at the answer position: a space after the completion
    template (``"... The character's name is"``), nothing at the start of a chat turn
    (:func:`~locos_tl.engine.continuation_tokens.answer_prefix`)."""
    return answer_prefix(trial)


def name_token_ids(tokenizer: Any, name: str, prefix: str = "", *,
                   context: str | None = None) -> list[int]:
    """The token ids of ``prefix + name`` (no special tokens), as the tokenizer writes
    them right after ``context`` (the prompt text).

    With ``context``, the ids are cut from the joint encoding (lm-evaluation-harness's
    rule for continuations;
    :func:`~locos_tl.engine.continuation_tokens.continuation_token_ids`, which see for
    a boundary merge). A tokenizer that marks the start of a text (SentencePiece's
    word-start ``▁`` under ``Metaspace(prepend_scheme="first")``: Llama-2, Mistral,
    Phi-3, TinyLlama) encodes a name on its own as ``▁Chiara`` but after
    ``"<|assistant|>\\n"`` as ``Chiara``; the joint encoding gives the latter, the
    sequence the model writes. Byte-level BPE (SmolLM2, Qwen, Llama-3) and tokenizers
    with no start-of-text rule give the same ids either way.

    Args:
        tokenizer: a Hugging Face tokenizer (or a model's ``.tokenizer``).
        name: the name (or answer) text.
        prefix: text before the name at the answer position (:func:`name_prefix`).
        context: the text the ids continue; None encodes ``prefix + name`` on its own.

    Raises:
        TrialError: the name tokenizes to nothing.
    """
    return names_token_ids(tokenizer, [name], prefix, context=context)[0]


def names_token_ids(tokenizer: Any, names: Sequence[str], prefix: str = "", *,
                    context: str | None = None) -> list[list[int]]:
    """:func:`name_token_ids` of several names after one ``context`` (encoded once).

    Raises:
        TrialError: a name tokenizes to nothing.
    """
    out = continuation_token_ids(tokenizer, [prefix + n for n in names], context=context)
    for name, ids in zip(names, out, strict=True):
        if not ids:
            raise TrialError(f"the name {name!r} tokenizes to nothing")
    return out


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
    """Token ids of the target's name, then each distractor's, as the tokenizer writes
    them right after the trial's prompt (:func:`name_prefix`, :func:`name_token_ids`
    with the prompt as ``context``).

    Raises:
        TrialError: no distractor names; a name that tokenizes to nothing.
    """
    target, rivals = candidate_names(trial)
    prefix, context = name_prefix(trial), trial_context(tokenizer, trial)
    return names_token_ids(tokenizer, [target, *rivals], prefix, context=context)


def margin_scorable(model: Any, trial: Trial, options: Any = None) -> str | None:
    """Why ``trial``'s name margin cannot be scored on ``model`` (None: it can): no
    distractor names, a name that tokenizes to nothing, or the prompt plus the longest
    name longer than ``n_ctx``. A per-trial check of
    :func:`locos_tl.experiments.methods.check_trials` (``options`` unused)."""
    try:
        check_continuations(model, trial.n_tokens, candidate_token_ids(model.tokenizer, trial),
                            what="name")
    except TrialError as exc:
        return str(exc)
    return None


def margin_of_logprobs(trial: Trial, logp: Sequence[float] | Tensor) -> dict[str, Any]:
    """:func:`name_margin`'s record from the log-probabilities (nats) of the names of
    :func:`candidate_token_ids`, computed elsewhere (say from a decoding's KV cache:
    ``greedy_decode(..., score_continuations=...)``)."""
    _, rivals = candidate_names(trial)
    logp = torch.as_tensor(logp, dtype=torch.float64)
    best = int(torch.argmax(logp[1:])) + 1
    return {"name_margin": float(logp[0] - logp[best]), "logp_target": float(logp[0]),
            "logp_best_distractor": float(logp[best]), "best_distractor": rivals[best - 1]}
