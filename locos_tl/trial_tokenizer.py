"""Trials and the tokenizer that made them: the token span of a needle in tokenized
text, and the refusal of trials whose token ids are another tokenizer's.

Token ids only mean something with the tokenizer that made them: a trial records that
tokenizer's fingerprint (:func:`locos_tl.tokenize.tokenizer_fingerprint`) and name, and
:func:`locos_tl.trials.check_trials_tokenizer` (:func:`check_tokenizer` here) refuses to
run trials on a model whose tokenizer has another fingerprint (organism trials on
SmolLM2, say) before any forward pass; trials without a fingerprint run, with one
warning per trial. :mod:`locos_tl.trials` holds the set of trial ids already warned
about, which it passes here.

This module does not import :mod:`locos_tl.trials` (which imports it); a trial here is
anything with ``trial_id``, ``tokenizer_fingerprint`` and ``tokenizer_name``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from locos_tl.errors import TrialError, warn_caller


def span_from_offsets(
    offsets: Sequence[tuple[int, int]], start: int, end: int, text: str
) -> tuple[int, int]:
    """Token span ``[s, e)`` covering characters ``[start, end)`` of ``text`` exactly.

    A token may overhang the character range only by whitespace (byte-level BPE and
    SentencePiece fold the leading space into the next token).

    Raises:
        TrialError: the range is not covered by whole tokens; names the characters cut.
    """
    covering = [i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start]
    if not covering:
        raise TrialError(f"no token covers characters [{start}, {end}) of the prompt")
    s, e = covering[0], covering[-1] + 1
    a0, b1 = offsets[s][0], offsets[e - 1][1]
    head, tail = text[a0:start], text[end:b1]
    if head.strip() or tail.strip():
        cut = []
        if head.strip():
            cut.append(f"{head!r} before it (characters [{a0}, {start}))")
        if tail.strip():
            cut.append(f"{tail!r} after it (characters [{end}, {b1}))")
        raise TrialError(
            "needle is not aligned to whole tokens: the tokens at its edges also cover "
            + " and ".join(cut)
        )
    return s, e


def tokenize_needle(
    tokenizer: Any, prompt: str, needle: str, *, n_ctx: int | None, add_special_tokens: bool,
) -> tuple[Any, tuple[int, int], Any]:
    """The token ids of ``prompt``, the token span of ``needle``'s first occurrence in it
    and the tokenizer's :class:`~locos_tl.tokenize.TokenizerIdentity`: the tokenizing
    part of :meth:`locos_tl.trials.Trial.from_text`, which see (arguments, errors).

    Raises:
        TrialError: empty needle, absent from the prompt or not aligned to whole tokens;
            prompt longer than ``n_ctx``; a BOS inside the prompt after position 0.
    """
    from locos_tl.tokenize import encode_prompt, tokenizer_identity

    if not needle or not needle.strip():
        raise TrialError("empty needle text")
    start = prompt.find(needle)
    if start < 0:
        raise TrialError(f"needle {needle[:60]!r} not found in the prompt text")
    end = start + len(needle)
    ids, offsets = encode_prompt(tokenizer, prompt,
                                 bos="checkpoint" if add_special_tokens else "none")
    if n_ctx is not None and len(ids) > n_ctx:
        raise TrialError(
            f"prompt has {len(ids)} tokens, longer than the model's context n_ctx={n_ctx}"
        )
    s, e = span_from_offsets(offsets, start, end, prompt)
    ident = tokenizer_identity(tokenizer)
    return ids, (s, e), ident


def identity_of_tokens(trial: Any, tokenizer: Any) -> Any:
    """``tokenizer``'s :class:`~locos_tl.tokenize.TokenizerIdentity` (``tokenizer`` itself
    when it is one), once every token id of ``trial`` is in its vocabulary:
    :meth:`locos_tl.trials.Trial.with_tokenizer`, which see.

    Raises:
        TrialError: a token id is not in ``tokenizer``'s vocabulary.
        TypeError: ``tokenizer`` is not a tokenizer.
    """
    from locos_tl.tokenize import TokenizerIdentity, checkpoint_tokenizer, tokenizer_identity

    if isinstance(tokenizer, TokenizerIdentity):
        ident = tokenizer
    else:
        ident = tokenizer_identity(tokenizer)
        size = len(checkpoint_tokenizer(tokenizer))
        if max(trial.tokens) >= size:
            raise TrialError(f"trial {trial.trial_id}: token id {max(trial.tokens)} is not "
                             f"in the vocabulary of {ident} ({size} tokens)")
    return ident


def tokenizer_of_file(tokenizer: Any) -> Any:
    """The :class:`~locos_tl.tokenize.TokenizerIdentity` a trials file is checked
    against (:func:`locos_tl.trials.load_trials`): None without a tokenizer, or for one
    without a vocabulary to fingerprint (nothing to compare with)."""
    from locos_tl.tokenize import tokenizer_identity

    if tokenizer is None:
        return None
    try:
        return tokenizer_identity(tokenizer)
    except TypeError:  # no vocabulary to fingerprint: nothing to compare with
        return None


def check_record_tokenizer(t: Any, own: Any, tokenizer: Any, unchecked: list[str]) -> None:
    """Check one token record of a trials file (:func:`locos_tl.trials.load_trials`): a
    trial without a fingerprint joins ``unchecked`` (its id); one made by another
    tokenizer than ``own`` (:func:`tokenizer_of_file`) is refused, and with
    ``tokenizer`` given, one holding the checkpoint's BOS after position 0.

    Raises:
        TrialError: another tokenizer's trial (the message names both); a BOS inside.
    """
    from locos_tl.tokenize import check_no_bos

    if not t.tokenizer_fingerprint:
        unchecked.append(t.trial_id)
    elif own is not None and t.tokenizer_fingerprint != own.fingerprint:
        raise TrialError(mismatch_message(t, own, "this trial", "the given tokenizer"))
    if tokenizer is not None:
        check_no_bos(tokenizer, t.tokens)


def warn_unchecked_file(path: Path, unchecked: list[str], n: int, warned: set[str]) -> None:
    """The one warning of a trials file (``path``, ``n`` trials) some of whose trials
    (the ids ``unchecked``) carry no tokenizer fingerprint; adds them to ``warned`` (so
    runs do not warn about them again). Nothing when ``unchecked`` is empty."""
    if unchecked:
        warn_caller(
            f"{path}: {len(unchecked)} of {n} trials carry no tokenizer fingerprint "
            "(the file was written before locos_tl recorded one): runs cannot check that "
            "their token ids are the model's; rebuild the file (locos build-trials) or mark "
            "the trials with trial.with_tokenizer(tokenizer)")
        warned.update(unchecked)


def mismatch_message(t: Any, own: Any, what: str, whose: str, plural: bool = False) -> str:
    """The message of trials tokenized by another tokenizer than ``own``'s; where both
    have the same name, it says that their vocabularies or special tokens differ."""
    theirs = t.tokenizer_name or "an unnamed tokenizer"
    same = ("; both have that name, but their vocabularies or special tokens differ (a "
            "token added, or a special token set, on one of them after loading: the name "
            "lists tokens added with add_special_tokens/add_tokens)"
            if theirs == own.name else "")
    return (f"{what} {'were' if plural else 'was'} tokenized by {theirs!r} (tokenizer "
            f"fingerprint {t.tokenizer_fingerprint}), not by {whose} {own.name!r} "
            f"(fingerprint {own.fingerprint}){same}: {'their' if plural else 'its'} token ids "
            "would be other tokens to the model. Build the trials with the model's tokenizer "
            "(Trial.from_text(model, ...), locos_tl.build_nolima_trials(model, ...), `locos "
            "build-trials ... --tokenizer DIR`); organism trials (locos_tl.organisms."
            "make_trials) run on the organisms only")


def check_tokenizer(model: Any, trials: Sequence[Any], warned: set[str]) -> None:
    """:func:`locos_tl.trials.check_trials_tokenizer`, which see; ``warned`` holds the
    ids of the trials already warned about for lacking a fingerprint (updated here).

    Raises:
        TrialError: a trial whose fingerprint differs from the model's tokenizer's.
    """
    from locos_tl.tokenize import model_tokenizer_identity

    own = model_tokenizer_identity(model)
    if own is None:
        return
    other = [(i, t) for i, t in enumerate(trials)
             if t.tokenizer_fingerprint and t.tokenizer_fingerprint != own.fingerprint]
    if other:
        i, t = other[0]
        what = (f"trial {i} ({t.trial_id})" if len(trials) == 1 else
                f"{len(other)} of {len(trials)} trials (the first: trial {i}, {t.trial_id})")
        raise TrialError(mismatch_message(t, own, what, "the model's tokenizer",
                                          plural=len(trials) > 1))
    unchecked = [t.trial_id for t in trials
                 if not t.tokenizer_fingerprint and t.trial_id not in warned]
    if unchecked:
        warn_caller(
            f"{len(unchecked)} of {len(trials)} trials carry no tokenizer fingerprint "
            "(built by hand from ids, or read from an old file): locos_tl cannot check that "
            f"their token ids are those of the model's tokenizer {own.name!r}; build trials "
            "with Trial.from_text / locos_tl.build_*_trials, or mark them with "
            "trial.with_tokenizer(model)")
        warned.update(unchecked)
