"""Answer metrics of the ablation evaluations: NoLiMa, MuSiQue, BABILong, controls.

Each *scorer* maps ``(response, trial)`` to ``{metric_name: value}`` (values in [0, 1]);
:func:`locos_tl.ablation_sweep` averages them over trials. Gold answers are
``trial.meta["gold_answers"]`` when present (NoLiMa's list), else ``[trial.answer]``.

Sources: NoLiMa (Modarressi et al. 2025, arXiv 2502.05167) ``contains`` metric (a gold
string occurs in the response, case-sensitive); ROUGE-L F-measure with stemming as in
Gema, Alex & Minervini 2026 (arXiv 2607.01002, Sec. 4); MuSiQue (Trivedi et al. 2022)
exact match and token F1 after SQuAD answer normalisation of the text inside an
``<answer>`` tag; BABILong (Kuratov et al. 2024) substring match; the specificity
controls of arXiv 2607.01002 (Sec. 4, parametric-knowledge and 1-digit arithmetic
questions) by exact match after lower-casing and stripping, as the authors' release
scores them (docs/concepts.md, protocol table), with NoLiMa ``contains`` kept as an option.

"The answer is in the response" is three different tests; each has one name and one
definition, here:

- ``contains`` (:func:`nolima_contains`): a gold string (answer or alias) is a substring of
  the stripped response, case-sensitive (NoLiMa). The ablation metric ``contains``.
- word match (:func:`answer_word_match`): the answer occurs in the response as a whole
  word (not inside a longer word), case-sensitive. The KV-compression column
  ``answer_correct`` (a published column name: kept).
- first token (:func:`first_token_match`): the first generated token is a first token of
  the answer. The KV-compression column ``correct`` (published: kept).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from locos_tl.engine.answers import normalize_answer, rougeL_f, token_f1
from locos_tl.trials import Trial

Scorer = Callable[[str, Trial], dict[str, float]]

_ANSWER_TAG = re.compile(r"<answer>(.*?)(?:</answer>|$)", flags=re.IGNORECASE | re.DOTALL)


def gold_answers(trial: Trial) -> list[str]:
    """Accepted gold strings: ``meta["gold_answers"]`` (+ ``meta["answer_aliases"]``),
    else the trial's answer."""
    golds = list(trial.meta.get("gold_answers") or [trial.answer])
    golds += list(trial.meta.get("answer_aliases") or [])
    return [g for g in golds if isinstance(g, str) and g.strip()]


def nolima_contains(response: str, golds: Sequence[str]) -> float:
    """NoLiMa's ``contains``: 1.0 when any gold string occurs in the stripped response
    (case-sensitive, as in NoLiMa's evaluator), else 0.0."""
    text = response.strip()
    return float(any(g in text for g in golds))


def answer_word_match(response: str, answer: str) -> bool:
    """The answer occurs in the response as a whole word: not preceded or followed by a
    word character (case-sensitive; the answer is stripped first). ``"Yuki"`` matches
    ``"The character is Yuki."`` but not ``"Yukiko"``, which NoLiMa's ``contains``
    (:func:`nolima_contains`) counts."""
    a = re.escape(answer.strip())
    return re.search(rf"(?<!\w){a}(?!\w)", response) is not None


def first_token_match(first_token: int | None, answer_first_tokens: Sequence[int]) -> bool:
    """The first generated token is a first token of the answer (one of its tokenizations'
    first ids, :func:`locos_tl.engine.answers.answer_token_variants`); ``False`` when
    nothing was generated."""
    return first_token is not None and first_token in answer_first_tokens


def extract_answer_tag(response: str) -> str:
    """Text inside the last ``<answer>...</answer>`` tag (an unclosed last tag runs to the
    end of the response); ``""`` when there is no tag."""
    found = _ANSWER_TAG.findall(response)
    return found[-1].strip() if found else ""


def musique_em_f1(response: str, golds: Sequence[str]) -> dict[str, float]:
    """MuSiQue exact match and F1 (max over gold aliases) of the ``<answer>`` text."""
    pred = extract_answer_tag(response)
    em = max(float(normalize_answer(pred) == normalize_answer(g)) for g in golds)
    f1 = max(token_f1(pred, g) for g in golds)
    return {"em": em, "f1": f1}


def babilong_substring(response: str, golds: Sequence[str]) -> float:
    """BABILong qa2/qa3 match: a gold answer occurs in the response (case-insensitive)."""
    text = response.lower()
    return float(any(g.strip().lower() in text for g in golds))


def control_exact_match(response: str, golds: Sequence[str]) -> float:
    """Exact match of the specificity controls: 1.0 when the response, lower-cased and
    stripped of surrounding whitespace, equals a gold string treated the same way.

    Source: the control metric ``P`` of the dissociation score (arXiv 2607.01002, Sec. 4;
    the authors' release scores the parametric and arithmetic controls by exact match
    after ``.lower().strip()``). Unlike NoLiMa ``contains``, ``"17"`` does not match
    ``"7"``, and ``" Paris "`` matches ``"paris"``.

    Args:
        response: the generated answer text.
        golds: accepted gold strings (answer and aliases).

    Returns:
        1.0 or 0.0.
    """
    text = response.lower().strip()
    return float(any(text == g.lower().strip() for g in golds))


def score_nolima(response: str, trial: Trial) -> dict[str, float]:
    """``rougeL`` (ROUGE-L F against ``trial.answer``, stemmer on) and NoLiMa ``contains``.

    A trial with distractor needles (``meta["distractor_names"]``, ``locos build-trials
    nolima --distractors N``) also gets ``contains_distractor`` (1.0 when the response
    names any distractor's character) and ``target_only`` (names the target and no
    distractor: the trial's strict score).
    """
    out = {"rougeL": rougeL_f(response, trial.answer),
           "contains": nolima_contains(response, gold_answers(trial))}
    rivals = trial.meta.get("distractor_names")
    if rivals:
        out["contains_distractor"] = nolima_contains(response, rivals)
        out["target_only"] = float(out["contains"] == 1.0 and not out["contains_distractor"])
    return out


def score_musique(response: str, trial: Trial) -> dict[str, float]:
    """MuSiQue ``em`` and ``f1`` of the ``<answer>`` text."""
    return musique_em_f1(response, gold_answers(trial))


def score_babilong(response: str, trial: Trial) -> dict[str, float]:
    """BABILong ``substring`` match."""
    return {"substring": babilong_substring(response, gold_answers(trial))}


def score_control(response: str, trial: Trial) -> dict[str, float]:
    """Specificity-control metrics: ``exact_match`` (:func:`control_exact_match`, the
    published control metric and the default ``P`` of
    :func:`locos_tl.experiments.dissociation.dissociation_score`) and NoLiMa ``contains``
    (case-sensitive
    substring; the former default, kept as an option)."""
    golds = gold_answers(trial)
    return {"exact_match": control_exact_match(response, golds),
            "contains": nolima_contains(response, golds)}


#: The control metric of the published dissociation score (``score_control`` rows).
DEFAULT_CONTROL_METRIC = "exact_match"
#: Control metrics :func:`score_control` writes.
CONTROL_METRICS = ("exact_match", "contains")
#: The retrieval metric of the dissociation score per built-in scorer.
RETRIEVAL_METRICS = {"nolima": "rougeL", "musique": "em", "babilong": "substring",
                     "control": "exact_match"}

SCORERS: dict[str, Scorer] = {
    "control": score_control,
    "nolima": score_nolima,
    "musique": score_musique,
    "babilong": score_babilong,
}


def get_scorer(scorer: str | Scorer) -> Scorer:
    """A scorer by name (``nolima``, ``musique``, ``babilong``, ``control``) or the callable
    itself.

    Raises:
        ValueError: unknown name.
    """
    if callable(scorer):
        return scorer
    try:
        return SCORERS[scorer]
    except KeyError:
        raise ValueError(f"unknown scorer {scorer!r}; use one of {sorted(SCORERS)} "
                         "or a callable (response, trial) -> dict") from None


def scorer_name(scorer: str | Any) -> str:
    return scorer if isinstance(scorer, str) else getattr(scorer, "__name__", "custom")
