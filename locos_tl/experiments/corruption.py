"""Corrupted prompts for causal patching: the needle replaced by filler or its answer
swapped for another name (CRI, :mod:`locos_tl.experiments.patching`; AtP,
:mod:`locos_tl.experiments.atp`).

Light on purpose (tokenizer work only, no torch): the per-trial checks of
:mod:`locos_tl.experiments.methods` build the corrupted prompt of every trial before any
forward pass, to refuse the ones that cannot be corrupted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, get_args

from locos_tl.engine.answers import answer_token_variants
from locos_tl.errors import TrialError
from locos_tl.tokenize import check_no_bos, encode_fragment
from locos_tl.trials import Trial

__all__ = ["CORRUPTIONS", "DEFAULT_FILLER", "DEFAULT_SWAP_NAMES", "AnswerPosition",
           "Corruption", "corrupt_tokens"]

Corruption = Literal["filler", "name_swap"]
CORRUPTIONS: tuple[str, ...] = get_args(Corruption)
AnswerPosition = Literal["generated", "prompt_end"]

#: Classic needle-in-a-haystack filler; tokenized and cycled to the needle's length.
DEFAULT_FILLER = ("The grass is green. The sky is blue. The sun is yellow. "
                  "Here we go. There and back again. ")
#: Replacement names for ``corruption="name_swap"`` (the first one of matching token
#: length that differs from the gold answer is used).
DEFAULT_SWAP_NAMES = ("Yuki", "Stuart", "Katie", "Veronica", "Gary", "Megan", "Calvin",
                      "Mandy", "Diana", "Caleb", "Emma", "Nathan", "Olivia", "Leo")


def corrupt_tokens(
    tokenizer: Any,
    trial: Trial,
    corruption: Corruption = "filler",
    *,
    filler: str | Sequence[int] = DEFAULT_FILLER,
    swap_names: Sequence[str] = DEFAULT_SWAP_NAMES,
) -> list[int]:
    """The trial's prompt with its needle corrupted; same length as the clean prompt.

    Args:
        tokenizer: the model's tokenizer (or the bridge); fragments are encoded by
            :func:`locos_tl.tokenize.encode_fragment` (no special tokens), so the
            corrupted prompt keeps the clean prompt's BOS at position 0 and gets none
            elsewhere.
        trial: the clean trial.
        corruption: ``"filler"`` replaces every needle token by filler tokens (``filler``
            text tokenized without special tokens, or ids, cycled); ``"name_swap"``
            replaces each occurrence of the gold answer's tokens inside the needle by
            another name of the same token length (from ``swap_names``).
        filler: filler text or token ids.
        swap_names: candidate replacement names.

    Raises:
        ValueError: unknown corruption, or empty filler.
        TrialError: ``name_swap`` finds no answer tokens in the needle, or no candidate
            name of the same token length; the filler holds the checkpoint's BOS.
    """
    if corruption not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {corruption!r}; use one of {list(CORRUPTIONS)}")
    toks = list(trial.tokens)
    s, e = trial.needle_span
    if corruption == "filler":
        fill = (encode_fragment(tokenizer, filler) if isinstance(filler, str)
                else [int(x) for x in filler])
        if not fill:
            raise ValueError("filler has no token")
        toks[s:e] = [fill[i % len(fill)] for i in range(e - s)]
        check_no_bos(tokenizer, fill, start=0, what="filler")
        return toks
    needle = toks[s:e]
    for variant in answer_token_variants(tokenizer, trial.answer):
        hits = [i for i in range(len(needle) - len(variant) + 1)
                if needle[i : i + len(variant)] == variant]
        if not hits:
            continue
        lead = " " if tokenizer.decode(variant[:1]).startswith(" ") else ""
        for name in swap_names:
            if name.strip().lower() == trial.answer.strip().lower():
                continue
            cand = encode_fragment(tokenizer, lead + name.strip())
            if len(cand) == len(variant):
                for i in hits:
                    needle[i : i + len(variant)] = cand
                toks[s:e] = needle
                return toks
        raise TrialError(f"no swap name tokenizes to {len(variant)} token(s) like "
                         f"{trial.answer!r}; pass swap_names")
    raise TrialError(f"answer {trial.answer!r} does not occur in the needle tokens")
