"""Which generated steps are answer steps, and whether a trial passes the gate.

docs/concepts.md "Which steps count" (Gema, Alex & Minervini 2026, arXiv 2607.01002):
a trial is kept when the ROUGE-1 recall of the response against the gold answer is
> 0.5 (``rouge_score``, stemmer on); its answer steps are the first exact contiguous
occurrence of the tokenized gold answer (with or without a leading space) in the
generated ids, else the steps whose characters overlap a case-insensitive match of
the answer in the response. Steps inside a ``<think> ... </think>`` reasoning block are
never answer steps (the search starts after the block, :func:`response_start`).
"""

from __future__ import annotations

import re
import string
import weakref
from collections import Counter
from collections.abc import Container, Iterable, Sequence
from functools import lru_cache
from typing import Any

from locos_tl.errors import TrialError

GATE_THRESHOLD = 0.5
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

_THINK_IDS: weakref.WeakKeyDictionary[Any, tuple[frozenset[int], frozenset[int]]] = (
    weakref.WeakKeyDictionary())


def think_token_ids(tokenizer: Any) -> tuple[frozenset[int], frozenset[int]]:
    """Ids of the tokens that open and close a reasoning block (Qwen3 style).

    A token counts when its decoded text, stripped, is exactly ``<think>`` or
    ``</think>`` (found by text, so any tokenizer that has such tokens qualifies).

    Returns:
        ``(open_ids, close_ids)``; both empty when the tokenizer has no such tokens.
    """
    try:
        return _THINK_IDS[tokenizer]
    except (KeyError, TypeError):
        pass
    opened: set[int] = set()
    closed: set[int] = set()
    for piece, i in tokenizer.get_vocab().items():
        if "think" not in piece:
            continue
        text = tokenizer.decode([i]).strip()
        if text == THINK_OPEN:
            opened.add(int(i))
        elif text == THINK_CLOSE:
            closed.add(int(i))
    out = (frozenset(opened), frozenset(closed))
    try:
        _THINK_IDS[tokenizer] = out
    except TypeError:  # not weak-referenceable: recompute next time
        pass
    return out


def response_start(
    tokenizer: Any, generated: Sequence[int], *, thinking_open: bool = False
) -> int:
    """Index of the first generated step after any ``<think> ... </think>`` block.

    The paper's steps exclude reasoning tokens (arXiv 2607.01002, "Which steps count";
    the authors' release skips the thinking block before the stop rule and the gate,
    docs/concepts.md). A block runs from an opening token (or from the start, when
    ``thinking_open``: the prompt ended inside one) to its closing token, inclusive; the
    response starts after the last closing token.

    Args:
        tokenizer: the model's tokenizer (thinking tokens found by
            :func:`think_token_ids`).
        generated: generated ids.
        thinking_open: the prompt left a thinking block open.

    Returns:
        ``0`` without thinking; ``len(generated)`` when a block is still open at the end
        (no response yet).
    """
    in_think, start = scan_think(generated, *think_token_ids(tokenizer),
                                 in_think=thinking_open)
    return len(generated) if in_think else start


def scan_think(
    ids: Iterable[int], opened: Container[int], closed: Container[int], *,
    in_think: bool = False,
) -> tuple[bool, int]:
    """Walk token ids through ``<think> ... </think>`` blocks: the one scan behind
    :func:`response_start` and the prompt state of greedy decoding
    (:class:`locos_tl.engine.stops.StopRules`).

    Args:
        ids: token ids, in order.
        opened, closed: the ids that open and close a block (:func:`think_token_ids`).
        in_think: a block is open before ``ids`` (the prompt left one open).

    Returns:
        ``(open, after)``: whether a block is still open after the last id, and the
        index just past the last closing token (``0`` without one).
    """
    after = 0
    for i, g in enumerate(ids):
        if g in opened:
            in_think = True
        elif g in closed:
            in_think, after = False, i + 1
    return in_think, after


@lru_cache(maxsize=4)
def _scorer(kind: str) -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer([kind], use_stemmer=True)


def rouge1_recall(response: str, answer: str) -> float:
    """ROUGE-1 recall of ``response`` against ``answer`` (stemmer on), in [0, 1]."""
    return float(_scorer("rouge1").score(answer, response)["rouge1"].recall)


def rougeL_f(response: str, answer: str) -> float:
    """ROUGE-L F-measure of ``response`` against ``answer`` (stemmer on), in [0, 1]."""
    return float(_scorer("rougeL").score(answer, response)["rougeL"].fmeasure)


def passes_gate(response: str, answer: str, threshold: float = GATE_THRESHOLD) -> bool:
    """The LOCOS trial gate: ROUGE-1 recall > ``threshold`` (0.5)."""
    return rouge1_recall(response, answer) > threshold


def answer_token_variants(tokenizer: Any, answer: str) -> list[list[int]]:
    """Tokenizations of the answer without and with a leading space.

    Raises:
        TrialError: the answer tokenizes to nothing.
    """
    out: list[list[int]] = []
    for text in (answer.strip(), " " + answer.strip()) if answer.strip() else ():
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        if ids and ids not in out:
            out.append(ids)
    if not out:
        raise TrialError(f"gold answer {answer!r} tokenizes to nothing")
    return out


def _find_sublist(hay: Sequence[int], needle: Sequence[int]) -> int:
    n = len(needle)
    for i in range(len(hay) - n + 1):
        if list(hay[i : i + n]) == list(needle):
            return i
    return -1


def answer_steps(
    tokenizer: Any, generated: Sequence[int], answer: str, *, start: int | None = None
) -> list[int]:
    """0-based indices of the generated steps that produce the gold answer.

    Only steps after a reasoning block count (a step inside ``<think> ... </think>`` is
    never an answer step, docs/concepts.md).

    Args:
        tokenizer: the model's tokenizer.
        generated: greedy token ids.
        answer: gold answer string.
        start: search ``generated[start:]`` only (e.g. ``DecodeResult.response_start``);
            default: after the last ``</think>`` in ``generated``
            (:func:`response_start`), or everything when there is none.

    Returns:
        Step indices into ``generated`` (possibly empty when the answer is not in the
        response).

    Raises:
        TrialError: the answer tokenizes to nothing.
    """
    variants = answer_token_variants(tokenizer, answer)
    start = response_start(tokenizer, generated) if start is None else max(0, int(start))
    found = _answer_steps_from(tokenizer, list(generated[start:]), answer, variants)
    return [start + i for i in found]


def _answer_steps_from(
    tokenizer: Any, generated: list[int], answer: str, variants: list[list[int]]
) -> list[int]:
    hits = [(i, len(v)) for v in variants if (i := _find_sublist(generated, v)) >= 0]
    if hits:
        i, n = min(hits)
        return list(range(i, i + n))
    # character fallback: decode token by token, overlap with a case-insensitive match
    pieces = [tokenizer.decode([g]) for g in generated]
    text = "".join(pieces)
    m = re.search(re.escape(answer.strip()), text, flags=re.IGNORECASE)
    if m is None:
        return []
    steps, pos = [], 0
    for i, p in enumerate(pieces):
        a, b = pos, pos + len(p)
        if b > m.start() and a < m.end():
            steps.append(i)
        pos = b
    return steps


def normalize_answer(text: str) -> str:
    """SQuAD/MuSiQue normalisation: lower case, no punctuation, no articles
    (a, an, the), single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def token_f1(prediction: str, gold: str) -> float:
    """Token-level F1 of normalised strings (SQuAD definition), in [0, 1]."""
    p, g = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((Counter(p) & Counter(g)).values())
    if not p or not g or common == 0:
        return float(p == g)
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)
