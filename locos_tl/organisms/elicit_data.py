"""Training and validation trials for :mod:`locos_tl.organisms.elicit`: NoLiMa trials with
distractor needles, built from a training needle set whose entries are split into
training and validation links (neither is ever an evaluation entry)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from locos_tl.data.haystack import Haystack
from locos_tl.data.nolima import NoLiMaEntry, expand_needle_set, prompt_form
from locos_tl.data.nolima_trials import build_nolima_trials
from locos_tl.data.prompt import PromptBuilder
from locos_tl.errors import DataFormatError
from locos_tl.trials import Trial

#: needle depths of the training trials (percent of the haystack part)
TRAIN_DEPTHS = tuple(float(d) for d in range(0, 101, 10))


def split_entries(entries: Sequence[NoLiMaEntry], n_validation: int, *, by: str = "last"
                  ) -> tuple[list[NoLiMaEntry], list[NoLiMaEntry]]:
    """``(training, validation)``. ``by="last"``: the last ``n_validation`` entries by id
    validate. ``by="kind"``: the validation entries are spread over the link kinds
    (``reasoning_type``): the last entry of each kind in turn, kinds in order of first
    appearance, until ``n_validation`` are taken.

    Raises:
        DataFormatError: fewer than ``n_validation + 2`` entries (a distractor needs an
            entry besides the target's on each side); an unknown ``by``.
    """
    ordered = sorted(entries, key=lambda e: e.id)
    if len(ordered) < n_validation + 2 or n_validation < 2:
        raise DataFormatError(f"{len(ordered)} entries cannot give {n_validation} "
                              "validation entries (at least 2) and 2 training entries")
    if by == "last":
        return ordered[:-n_validation], ordered[-n_validation:]
    if by != "kind":
        raise DataFormatError(f"validation split must be 'last' or 'kind', not {by!r}")
    kinds: dict[str, list[NoLiMaEntry]] = {}
    for e in ordered:
        kinds.setdefault(e.reasoning_type, []).append(e)
    held: list[NoLiMaEntry] = []
    depth = 1
    while len(held) < n_validation:
        if depth >= max(len(es) for es in kinds.values()):
            raise DataFormatError(f"{len(ordered)} entries in {len(kinds)} kinds cannot "
                                  f"give {n_validation} validation entries and keep an "
                                  "entry of every kind for training")
        for es in kinds.values():
            if len(es) > depth and len(held) < n_validation:
                held.append(es[-depth])
        depth += 1
    ids = {e.id for e in held}
    return [e for e in ordered if e.id not in ids], sorted(held, key=lambda e: e.id)


def run_entries(needle_set: str, n_validation: int, *, by: str = "kind",
                val_needle_set: str = "") -> tuple[list[NoLiMaEntry], list[NoLiMaEntry]]:
    """``(training, validation)`` entries of a run: :func:`split_entries` of
    ``needle_set``. With ``val_needle_set`` (e.g. ``hop_val``) the validation entries are
    that set's instead: link kinds never trained on, so early stopping rewards a hop that
    carries over to new links rather than the training kinds. The training entries stay
    the same either way (the held-out ones then validate nothing).

    Raises:
        DataFormatError: as :func:`split_entries`; a validation set that shares a link
            kind or an entry id with the training entries.
    """
    from locos_tl.data.nolima import load_needle_set

    train, val = split_entries(load_needle_set(needle_set), n_validation, by=by)
    if not val_needle_set:
        return train, val
    val = sorted(load_needle_set(val_needle_set), key=lambda e: e.id)
    for what, key in (("link kinds", lambda e: e.reasoning_type), ("entry ids", lambda e: e.id)):
        if shared := {key(e) for e in val} & {key(e) for e in train}:
            raise DataFormatError(f"validation set {val_needle_set!r} shares {what} with "
                                  f"the training set {needle_set!r}: {sorted(shared)[:5]}")
    return train, val


def training_trials(tokenizer: Any, entries: Sequence[NoLiMaEntry],
                    haystacks: Sequence[Haystack], *, steps: int,
                    lengths: Sequence[int], distractors: Sequence[int],
                    question_types: Sequence[str], seed: int,
                    builder: PromptBuilder | None = None, template: str = "chat"
                    ) -> list[Trial]:
    """``steps`` trials, one a training step, in a seeded order, rendered with
    ``template`` (:func:`prompt_form`).

    Every (question type, length, distractor count) group gets an equal share; each share
    is a stratified sample of (entry, test, depth) with three characters an entry.

    Raises:
        DataFormatError, HaystackTooShortError: see :func:`build_nolima_trials`.
    """
    builder = builder or PromptBuilder(tokenizer)
    groups = [(q, L, n) for q in question_types for L in lengths for n in distractors]
    share = -(-steps // len(groups))
    out: list[Trial] = []
    for g, (qtype, length, n) in enumerate(groups):
        items = expand_needle_set(entries, [qtype])
        out += build_nolima_trials(
            tokenizer, items, haystacks, lengths=[length], depths=TRAIN_DEPTHS,
            num_examples=share, characters_per_entry=3, seed=seed * 1000 + g,
            builder=builder, distractors=n, **prompt_form(template))
    random.Random(f"elicit-order:{seed}").shuffle(out)
    return out[:steps]


def validation_trials(tokenizer: Any, entries: Sequence[NoLiMaEntry],
                      haystacks: Sequence[Haystack], *, n: int, length: int,
                      question_types: Sequence[str], seed: int,
                      builder: PromptBuilder | None = None, template: str = "chat"
                      ) -> dict[str, list[Trial]]:
    """``n`` trials per question type on the validation entries, one distractor each,
    ``{question type: trials}``."""
    builder = builder or PromptBuilder(tokenizer)
    return {q: build_nolima_trials(
        tokenizer, expand_needle_set(entries, [q]), haystacks, lengths=[length],
        depths=TRAIN_DEPTHS, num_examples=n, seed=seed + 7, builder=builder,
        distractors=1, **prompt_form(template)) for q in question_types}
