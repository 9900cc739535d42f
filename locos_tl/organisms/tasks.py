"""The organism's two retrieval tasks in one context format, and trial builders.

Context (one sequence, word tokens)::

    <s> filler ... NAME_1 LANDMARK_1 ... NAME_d ... LANDMARK_d ... NAME_2 LANDMARK_2 ... Q X

- ``n_pairs`` adjacent ``NAME LANDMARK`` pairs (one of them is the *needle*, the
  others are distractor pairs), ``n_lone_names`` lone distractor names and
  ``n_lone_landmarks`` lone distractor landmarks, scattered at random in filler.
  All names in a context differ; all landmarks in a context lie in different cities.
- *literal* question (NIAH-like): ``X`` is the needle's NAME; the answer is its
  LANDMARK, i.e. the token at the needle position a retrieval head attends to (copy).
- *non-literal* question (NoLiMa-like): ``X`` is ``city(LANDMARK)`` of the needle (the
  hidden map :data:`~locos_tl.organisms.vocab.CITY_OF`, never in the context); the
  answer is the needle's NAME, which is *not* the token at the landmark position a
  head must find (the name was moved there by a previous-token head).

Training sequences append ``ANSWER </s>``; trials stop after ``X``. The needle span
of a trial is the needle ``NAME LANDMARK`` (2 tokens) for both tasks.

Filler is either i.i.d. frequency-weighted English words (with ``<unk>`` at rate
``unk_rate``) or a contiguous window of real book text mapped to the vocabulary
(unknown words -> ``<unk>``), see :class:`BookFiller`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from locos_tl.organisms import vocab as V
from locos_tl.trials import Trial

Task = Literal["literal", "nonliteral"]
TASKS: tuple[Task, ...] = ("literal", "nonliteral")


@dataclass(frozen=True)
class ContextSpec:
    """How many entities a context holds (each drawn uniformly from its range, inclusive).

    Attributes:
        n_pairs: ``NAME LANDMARK`` pairs, the needle included (>= 1).
        n_lone_names: lone distractor names.
        n_lone_landmarks: lone distractor landmarks.
        unk_rate: probability that a synthetic filler word is ``<unk>``.
    """

    n_pairs: tuple[int, int] = (2, 3)
    n_lone_names: tuple[int, int] = (3, 6)
    n_lone_landmarks: tuple[int, int] = (1, 3)
    unk_rate: float = 0.12


@dataclass
class Example:
    """One generated prompt.

    Attributes:
        ids: prompt token ids, ``<s>`` first, ending with the question's ``X`` token.
        needle_span: ``(s, e)`` of the needle ``NAME LANDMARK`` in ``ids``.
        answer_id: id of the gold answer token.
        task: ``"literal"`` or ``"nonliteral"``.
        name: needle name; landmark: needle landmark; city: its city.
        extra_questions: for training, ``[(question_ids, answer_id), ...]`` about the
            other (distractor) pairs, each with a random task type.
    """

    ids: list[int]
    needle_span: tuple[int, int]
    answer_id: int
    task: Task
    name: str
    landmark: str
    city: str
    extra_questions: list[tuple[list[int], int]] = field(default_factory=list)


class _Ids:
    def __init__(self) -> None:
        t2i = V.token_to_id()
        self.t2i = t2i
        self.names = np.array([t2i[w] for w in V.NAMES])
        self.landmarks = np.array([t2i[w] for w in V.LANDMARKS])
        self.city_of_lm = {t2i[lm]: t2i[c] for lm, c in V.CITY_OF.items()}
        self.city_idx = {c: i for i, c in enumerate(V.CITIES)}
        self.lm_city_idx = np.array([self.city_idx[V.CITY_OF[lm]] for lm in V.LANDMARKS])
        words, freqs = V.filler_words()
        self.filler = np.array([t2i[w] for w in words])
        p = np.asarray(freqs, dtype=np.float64)
        self.filler_p = p / p.sum()
        self.unk, self.bos, self.eos, self.q = t2i[V.UNK], t2i[V.BOS], t2i[V.EOS], t2i[V.QMARK]


_IDS: _Ids | None = None


def ids_table() -> _Ids:
    """Cached id tables (names, landmarks, city map, filler distribution)."""
    global _IDS
    if _IDS is None:
        _IDS = _Ids()
    return _IDS


class BookFiller:
    """Real book text mapped to the organism's vocabulary, served as filler windows.

    Words are ``[A-Za-z]+`` runs, lowercased; words outside the filler vocabulary
    become ``<unk>`` (entity words cannot occur: entities are capitalised tokens).

    Args:
        paths: text files (e.g. the shipped books of :func:`default_book_dir`).

    Raises:
        FileNotFoundError: no path exists or the files hold no words.
    """

    def __init__(self, paths: list[str | Path]) -> None:
        t = ids_table()
        filler_ids = {V.vocab_list()[i]: int(i) for i in t.filler}
        toks: list[int] = []
        found = 0
        for p in paths:
            p = Path(p)
            if not p.is_file():
                continue
            found += 1
            for w in re.findall(r"[A-Za-z]+", p.read_text(errors="replace")):
                toks.append(filler_ids.get(w.lower(), t.unk))
        if not found or not toks:
            raise FileNotFoundError(f"no book text found in {[str(p) for p in paths]}")
        self.tokens = np.asarray(toks, dtype=np.int64)
        self.unk_fraction = float((self.tokens == t.unk).mean())

    @classmethod
    def from_dir(cls, directory: str | Path) -> BookFiller:
        """All ``*.txt`` files of ``directory`` (sorted by name).

        Raises:
            FileNotFoundError: the directory is missing or holds no text.
        """
        d = Path(directory)
        files = sorted(d.glob("*.txt")) if d.is_dir() else ([d] if d.is_file() else [])
        if not files:
            raise FileNotFoundError(f"no *.txt book files under {d}")
        return cls(files)

    def window(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """A random contiguous window of ``n`` mapped tokens."""
        if n > len(self.tokens):
            raise ValueError(f"book text has {len(self.tokens)} words, need {n}")
        start = int(rng.integers(0, len(self.tokens) - n + 1))
        return self.tokens[start : start + n]


def default_book_dir() -> Path:
    """The public-domain books shipped with locos_tl (:func:`locos_tl.data.packaged.book_dir`).

    Raises:
        PackagedDataError: a packaged book is missing or damaged, or the folder holds a
            ``*.txt`` the manifest does not list.
    """
    from locos_tl.data.packaged import book_dir

    return book_dir()


def make_example(
    rng: np.random.Generator,
    n_tokens: int,
    task: Task,
    spec: ContextSpec = ContextSpec(),
    book: BookFiller | None = None,
    needle_first: bool = False,
) -> Example:
    """Generate one prompt of exactly ``n_tokens`` tokens (``<s>`` ... ``Q X``).

    Args:
        rng: numpy generator (all randomness comes from it).
        n_tokens: prompt length including ``<s>`` and the 2 question tokens.
        task: ``"literal"`` or ``"nonliteral"``.
        spec: entity counts.
        book: real-text filler; ``None``: synthetic frequency-weighted filler.
        needle_first: put the needle pair before every other entity (so it sits early,
            far from the question: depth about ``1 / (n_entities + 1)`` on average);
            draws no extra randomness, so ``False`` leaves the stream unchanged.

    Raises:
        ValueError: ``n_tokens`` too small for the entities (needs about 2x their count).
    """
    t = ids_table()
    n_pairs = int(rng.integers(spec.n_pairs[0], spec.n_pairs[1] + 1))
    n_ln = int(rng.integers(spec.n_lone_names[0], spec.n_lone_names[1] + 1))
    n_ll = int(rng.integers(spec.n_lone_landmarks[0], spec.n_lone_landmarks[1] + 1))
    body = n_tokens - 3
    n_entity_tokens = 2 * n_pairs + n_ln + n_ll
    if body < n_entity_tokens + 4:
        raise ValueError(f"n_tokens={n_tokens} is too short for {n_entity_tokens} entity tokens")
    names = rng.choice(t.names, size=n_pairs + n_ln, replace=False)
    cities = rng.choice(len(V.CITIES), size=n_pairs + n_ll, replace=False)
    lms = []
    for c in cities:
        cands = t.landmarks[t.lm_city_idx == c]
        lms.append(int(rng.choice(cands)))
    items: list[list[int]] = []
    for i in range(n_pairs):
        items.append([int(names[i]), lms[i]])
    for i in range(n_ln):
        items.append([int(names[n_pairs + i])])
    for i in range(n_ll):
        items.append([lms[n_pairs + i]])
    n_fill = body - n_entity_tokens
    if book is None:
        fill = rng.choice(t.filler, size=n_fill, p=t.filler_p)
        fill = np.where(rng.random(n_fill) < spec.unk_rate, t.unk, fill)
    else:
        fill = book.window(rng, n_fill)
    # items go into random gaps of the filler sequence (order of filler preserved)
    order = rng.permutation(len(items))
    if needle_first:
        order = np.concatenate([[0], order[order != 0]])
    gaps = np.sort(rng.integers(0, n_fill + 1, size=len(items)))
    ids = [t.bos]
    needle_start = -1
    fi = 0
    for k, it_idx in enumerate(order):
        g = int(gaps[k])
        ids.extend(int(x) for x in fill[fi:g])
        fi = g
        if it_idx == 0:
            needle_start = len(ids)
        ids.extend(items[it_idx])
    ids.extend(int(x) for x in fill[fi:])
    name_id, lm_id = items[0]
    city_id = t.city_of_lm[lm_id]
    if task == "literal":
        ids += [t.q, name_id]
        answer = lm_id
    elif task == "nonliteral":
        ids += [t.q, city_id]
        answer = name_id
    else:
        raise ValueError(f"unknown task {task!r}; use 'literal' or 'nonliteral'")
    assert len(ids) == n_tokens, (len(ids), n_tokens)
    extra = []
    for k in range(1, n_pairs):
        nm, lm = items[k]
        if rng.random() < 0.5:
            extra.append(([t.q, nm], lm))
        else:
            extra.append(([t.q, t.city_of_lm[lm]], nm))
    vl = V.vocab_list()
    return Example(ids, (needle_start, needle_start + 2), int(answer), task,
                   vl[name_id], vl[lm_id], vl[city_id], extra)


def training_batch(
    rng: np.random.Generator,
    batch_size: int,
    n_tokens: int,
    spec: ContextSpec = ContextSpec(),
    p_literal: float = 0.5,
    n_questions: int = 2,
    eos_each: bool = False,
    book: BookFiller | None = None,
    p_book: float = 0.0,
    p_needle_first: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """A batch of training sequences and the positions whose next token is trained.

    Each sequence is ``prompt A_1 Q X_2 A_2 ... Q X_q A_q </s>`` (``eos_each=False``) or
    ``prompt A_1 </s> Q X_2 A_2 </s> ... Q X_q A_q </s>`` (``eos_each=True``: every answer
    is followed by ``</s>``, so generation stops right after the answer): the first question
    is the trial format (about the needle), further questions ask about the distractor
    pairs (each pair once, random task). ``spec.n_pairs[0]`` must be >= ``n_questions``.
    With ``book``, a fraction ``p_book`` of the rows takes its filler from real book text.
    A fraction ``p_needle_first`` of the rows puts the needle before every other entity
    (long-distance retrieval; see :func:`make_example`); at 0 it draws no randomness.

    Returns:
        ``(ids, targets_pos)``: int64 ``[batch, total]``; int64 positions ``p`` whose
        prediction of ``ids[:, p + 1]`` is trained (every ``X_i``; the answer(s) followed
        by ``</s>``).
    """
    t = ids_table()
    if spec.n_pairs[0] < n_questions:
        raise ValueError("every context needs at least n_questions pairs")
    block = 4 if eos_each else 3
    total = n_tokens + block * n_questions - (2 if eos_each else 1)
    ids = np.empty((batch_size, total), dtype=np.int64)
    for b in range(batch_size):
        task: Task = "literal" if rng.random() < p_literal else "nonliteral"
        use_book = book is not None and p_book > 0 and rng.random() < p_book
        first = p_needle_first > 0 and rng.random() < p_needle_first
        ex = make_example(rng, n_tokens, task, spec, book if use_book else None, first)
        seq = ex.ids + [ex.answer_id] + ([t.eos] if eos_each else [])
        for q, a in ex.extra_questions[: n_questions - 1]:
            seq += q + [a] + ([t.eos] if eos_each else [])
        ids[b] = seq if eos_each else seq + [t.eos]
    xs = [n_tokens - 1 + block * i for i in range(n_questions)]
    if eos_each:
        pos = sorted(xs + [x + 1 for x in xs])
    else:
        pos = xs + [total - 2]
    return ids, np.asarray(pos, dtype=np.int64)


def induction_batch(rng: np.random.Generator, batch_size: int, total: int,
                    p_entity: float = 0.5) -> np.ndarray:
    """Auxiliary sequences ``<s> r r'`` where ``r'`` repeats the random sequence ``r``.

    Tokens of ``r`` are entities (names/landmarks/cities, uniform) with probability
    ``p_entity``, else frequency-weighted filler. Predicting the repeat is induction,
    a dense signal that speeds up the previous-token + induction circuit both tasks
    build on. Loss goes on positions ``>= 1 + len(r)`` (see the training loop).

    Returns:
        int64 ``[batch, total]``.
    """
    t = ids_table()
    ents = np.concatenate([t.names, t.landmarks, np.array(list(set(t.city_of_lm.values())))])
    m = (total - 1 + 1) // 2
    out = np.empty((batch_size, total), dtype=np.int64)
    for b in range(batch_size):
        r = np.where(rng.random(m) < p_entity, rng.choice(ents, size=m),
                     rng.choice(t.filler, size=m, p=t.filler_p))
        seq = np.concatenate([[t.bos], r, r])[:total]
        out[b] = seq
    return out


def example_to_trial(ex: Example, meta: dict | None = None) -> Trial:
    """Wrap an :class:`Example` as a :class:`~locos_tl.trials.Trial` (needle = the pair),
    marked with the organism vocabulary's tokenizer fingerprint
    (:func:`locos_tl.organisms.vocab.tokenizer_identity`): it runs on the organisms only."""
    vl = V.vocab_list()
    words = [vl[i] for i in ex.ids[1:]]
    m = {"task": ex.task, "name": ex.name, "landmark": ex.landmark, "city": ex.city,
         "n_tokens": len(ex.ids), "query_start": len(ex.ids) - 2}  # the `Q` token
    m.update(meta or {})
    tok = V.tokenizer_identity()
    return Trial(tokens=tuple(ex.ids), needle_span=ex.needle_span, answer=vl[ex.answer_id],
                 prompt=" ".join(words), meta=m, tokenizer_fingerprint=tok.fingerprint,
                 tokenizer_name=tok.name)


def make_trials(
    task: Task,
    n: int,
    n_tokens: int | list[int] = 64,
    *,
    seed: int = 12345,
    spec: ContextSpec = ContextSpec(),
    book: BookFiller | str | Path | None = None,
) -> list[Trial]:
    """Held-out trials for one task.

    Held out by seed: training draws from ``seed`` streams ``>= 1_000_000`` (see
    :mod:`locos_tl.organisms.train`), trial builders from the seed given here
    (default 12345) mixed with the task, so no trial stream coincides with training.

    Args:
        task: ``"literal"`` or ``"nonliteral"``.
        n: number of trials.
        n_tokens: prompt length, or a list cycled over the trials.
        seed: RNG seed.
        spec: entity counts.
        book: a :class:`BookFiller`, or a directory/file of book text, or ``None``
            (synthetic filler).

    Returns:
        ``n`` trials; ``meta`` holds task, name, landmark, city, n_tokens, filler. The
        ids are the organism vocabulary's, and the trials carry its tokenizer
        fingerprint: scoring them on another model (SmolLM2, say) raises ``TrialError``.

    Raises:
        FileNotFoundError: ``book`` is a path without text.
    """
    if isinstance(book, (str, Path)):
        book = BookFiller.from_dir(book)
    rng = np.random.default_rng([seed, TASKS.index(task), 7])
    lens = [n_tokens] if isinstance(n_tokens, int) else list(n_tokens)
    filler = "book" if book is not None else "synthetic"
    return [
        example_to_trial(make_example(rng, lens[i % len(lens)], task, spec, book),
                         {"filler": filler, "index": i})
        for i in range(n)
    ]
