"""A trial's question: its token span, and what QRHead reads of a trial.

QRHead (:mod:`locos_tl.experiments.qrhead`) and the cross-model comparison
(:mod:`locos_tl.experiments.cross_model`) read the attention of the question's tokens.
Light on purpose (tokenizer work only, no torch): the per-trial checks of
:mod:`locos_tl.experiments.methods` locate every trial's question before any forward
pass, to refuse the trials that have none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from locos_tl.errors import TrialError
from locos_tl.head_spec import as_int
from locos_tl.tokenize import encode_fragment, encode_prompt
from locos_tl.trial_tokenizer import span_from_offsets
from locos_tl.trials import Trial, as_span

__all__ = ["qrhead_inputs", "question_span"]


def _find_text(tokenizer: Any, trial: Trial, text: str) -> tuple[int, int] | None:
    """Token span of the last occurrence of ``text`` in the trial: from the prompt's
    character offsets when re-encoding ``trial.prompt`` gives ``trial.tokens``, else by
    searching its tokens (with and without a leading space)."""
    if trial.prompt and text in trial.prompt:
        start = trial.prompt.rfind(text)
        for bos in ("checkpoint", "none"):
            ids, offsets = encode_prompt(tokenizer, trial.prompt, bos=bos)  # type: ignore[arg-type]
            if tuple(ids) == tuple(trial.tokens):
                try:
                    return span_from_offsets(offsets, start, start + len(text), trial.prompt)
                except TrialError:
                    break
    toks, found = list(trial.tokens), None
    for variant in (text, " " + text):
        ids = encode_fragment(tokenizer, variant)
        at = [i for i in range(len(toks) - len(ids) + 1) if toks[i : i + len(ids)] == ids]
        if ids and at and (found is None or at[-1] > found[0]):
            found = (at[-1], at[-1] + len(ids))
    return found


def question_span(tokenizer: Any, trial: Trial) -> tuple[int, int]:
    """The token span ``[a, b)`` of the trial's question, from its ``meta``.

    In order: ``meta["question_span"]`` (``[a, b)``); ``meta["question"]``, the
    question's text (NoLiMa and NIAH trials), found at its last occurrence in the prompt;
    ``meta["query_start"]`` (organism trials: the question runs from there to the end;
    negative counts from the end).

    Raises:
        TrialError: none of them, a question text that does not occur in the prompt's
            tokens, or a span outside the prompt (the message names the trial).
    """
    meta, n = trial.meta or {}, trial.n_tokens
    where = f"trial {trial.trial_id}"
    if meta.get("question_span") is not None:
        return as_span(meta["question_span"], n, f"{where}: meta['question_span']",
                       name=f"{where}: question span")
    q = meta.get("question")
    if isinstance(q, str) and q.strip():
        span = _find_text(tokenizer, trial, q.strip())
        if span is None:
            raise TrialError(f"{where}: its question {q.strip()[:80]!r} (meta['question']) "
                             "does not occur in its tokens; give meta['question_span'] = "
                             "[start, end), the question's token span")
        return span
    if meta.get("query_start") is not None:
        qs = as_int(meta["query_start"], f"{where}: meta['query_start']", TrialError)
        return as_span((qs + n if qs < 0 else qs, n), n, f"{where}: meta['query_start']",
                       name=f"{where}: question span")
    raise TrialError(f"{where}: no question for QRHead: give meta['question'] (its "
                     "text), meta['question_span'] = [start, end) or meta['query_start']")



def qrhead_inputs(
    tokenizer: Any, trial: Trial, span: str = "needle",
    null_question: str | Sequence[int] = "N/A",
) -> tuple[tuple[int, int], tuple[int, int], list[int]]:
    """What QRHead reads of a trial: ``(question [a, b), document [s, e), null ids)``.

    The question is :func:`question_span`'s; the document is ``trial.span(span)`` and
    must end before the question starts (the question's rows attend to it); a text null
    question is encoded with the question's leading space (token ids are taken as
    they are).

    Raises:
        TrialError: no question; the document not before it; a null question with no
            token (each message names the trial).
        ValueError: an unknown span.
    """
    a, b = question_span(tokenizer, trial)
    s, e = trial.span(span)
    if e > a:
        raise TrialError(f"trial {trial.trial_id}: the {span} span [{s}, {e}) is not "
                         f"before the question [{a}, {b}): the question cannot attend to it")
    if isinstance(null_question, str):
        lead = " " if tokenizer.decode(list(trial.tokens[a : a + 1])).startswith(" ") else ""
        null_ids = encode_fragment(tokenizer, lead + null_question.strip())
    else:
        null_ids = [int(x) for x in null_question]
    if not null_ids:
        raise TrialError(f"trial {trial.trial_id}: the null question {null_question!r} "
                         "has no token")
    return (a, b), (s, e), null_ids
