"""Needle sets shipped with locos_tl, and the lexical check behind non-literal questions.

The sets are NoLiMa-format JSON files in this folder (``<name>.json``; Modarressi et al.
2025, "NoLiMa", arXiv 2502.05167): ``everyday`` asks each needle two ways, ``direct``
(the question repeats the needle's key words) and ``onehop`` (no content word in common;
the link is a synonym, a hypernym or everyday knowledge). Load one by name with
:func:`locos_tl.data.load_needle_set` (``load_needle_set("everyday")``).

The sets and what each is for:

* ``everyday`` (24 entries): the protocol's default set, and a second evaluation set of
  an elicited onehop hop.
* ``everyday_train`` (60): the training set of the first elicited adapter only.
* ``hop_train``, ``hop_detect``, ``hop_eval``: the onehop elicitation's three disjoint
  sets, fixed before training and never tuned on (written by
  ``scripts/make_hop_sets.py``). Every test's ``input_args`` are ``[cue, target]``: the
  needle names the cue (``{CHAR} has rented a small flat in Paris``), the ``onehop``
  question what it links to (``Which character lives in France?``), ``reasoning_type``
  the link kind (``city_country``). ``hop_train`` (165 entries, 11 kinds) trains the
  hop; ``hop_detect`` (44, 4 of the training kinds) is where head rankings are
  computed, with no needle template, question, cue, target or name of training;
  ``hop_eval`` (48, 8 kinds absent from training) is where ablations and targets run.
  No entry id, filled needle, question or character name is shared among the three,
  nor with ``everyday`` / ``everyday_train`` (``tests/test_hop_sets.py``).
  ``locos reproduce --detect-needle-set hop_detect --eval-needle-set hop_eval`` uses
  the last two.
* ``hop_val`` (24 entries, 4 kinds absent from the other sets, with cues, targets and
  names of its own): validation across link kinds, for early stopping and recipe
  choices (``locos elicit --val-needle-set hop_val``), so that neither ever reads an
  evaluation entry.

:func:`shared_content_words` is the check that makes "non-literal" testable: after the
slots are filled, a question is non-literal when it shares no content word with its
needle. Words are compared lower-cased, after Porter stemming (``nltk``, the stemmer
``rouge-score`` uses), and a word that starts with another's stem of at least 4 letters
counts as shared too (``farm`` / ``farmer``, ``bake`` / ``bakery``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from locos_tl.data.nolima import NoLiMaEntry

#: Function words ignored by :func:`content_words` (articles, pronouns, auxiliaries,
#: prepositions, conjunctions, question words, quantifiers).
STOPWORDS = frozenset("""
a an the this that these those some any each every all no not nor
i me my you your he him his she her it its we us our they them their one ones
who whom whose which what when where why how
is am are was were be been being has have had having do does did done
will would shall should can could may might must
to of in on at by for with from into onto over under about after before since
until during than then as so too very just also only up down out off
and or but if because while
s t
""".split())

_WORD = re.compile(r"[a-z]+")
_PREFIX_MIN = 4


@lru_cache(maxsize=4096)
def _stem(word: str) -> str:
    return _stemmer().stem(word) if len(word) > 2 else word


@lru_cache(maxsize=1)
def _stemmer():  # noqa: ANN202 - nltk class
    from nltk.stem.porter import PorterStemmer

    return PorterStemmer()


def content_words(text: str, ignore: Iterable[str] = ()) -> set[str]:
    """The stems of the content words of ``text``.

    Args:
        text: a needle or question with its slots filled.
        ignore: words to leave out as well (e.g. the character's name), any case.

    Returns:
        lower-cased Porter stems of the words that are not in :data:`STOPWORDS` or
        ``ignore`` (letters only: ``"Mill Road's"`` gives ``{"mill", "road"}``).
    """
    skip = STOPWORDS | {w.lower() for w in ignore}
    return {_stem(w) for w in _WORD.findall(text.lower()) if w not in skip}


def _related(a: str, b: str) -> bool:
    short, long_ = sorted((a, b), key=len)
    return a == b or (len(short) >= _PREFIX_MIN and long_.startswith(short))


def shared_content_words(needle: str, question: str, ignore: Iterable[str] = ()) -> set[str]:
    """Content-word stems the question has in common with the needle (empty: no lexical
    overlap, the question is non-literal).

    Two stems count as shared when equal, or when the shorter one (at least 4 letters)
    starts the longer one.
    """
    nw, qw = content_words(needle, ignore), content_words(question, ignore)
    return {q for q in qw if any(_related(q, n) for n in nw)}


def lexical_overlaps(entries: Sequence[NoLiMaEntry], question_type: str = "onehop",
                     ) -> list[tuple[str, str, set[str]]]:
    """Every (entry id, test id, shared stems) whose filled ``question_type`` question
    shares a content word with its filled needle; ``[]`` when all are non-literal.

    ``{CHAR}`` is left out of both texts (the name is the answer, not a cue).
    """
    from locos_tl.data.nolima import expand_needle_set

    bad = []
    for it in expand_needle_set(entries, [question_type]):
        needle = it.needle.replace("{CHAR}", " ")
        question = it.question.replace("{CHAR}", " ")
        shared = shared_content_words(needle, question)
        if shared:
            bad.append((it.entry_id, it.test_id, shared))
    return bad
