"""Retrieval trials: a tokenized prompt, its needle span and the gold answer.

A :class:`Trial` is the unit every scorer, ablation sweep and patching run consumes
(Gema, Alex & Minervini 2026, arXiv 2607.01002, Sec. 3: "a prompt of N tokens that
contains a needle span [s, e) and a gold answer").

Token ids only mean something with the tokenizer that made them: a trial records that
tokenizer's fingerprint (:func:`locos_tl.tokenize.tokenizer_fingerprint`) and name, and
:func:`check_trials_tokenizer` refuses to run trials on a model whose tokenizer has
another fingerprint (organism trials on SmolLM2, say) before any forward pass; the
tokenizer side of trials lives in :mod:`locos_tl.trial_tokenizer`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from locos_tl.errors import TrialError, warn_caller
from locos_tl.head_spec import as_int
from locos_tl.trial_tokenizer import (
    check_record_tokenizer,
    check_tokenizer,
    identity_of_tokens,
    tokenize_needle,
    tokenizer_of_file,
    warn_unchecked_file,
)

__all__ = ["Trial", "as_span", "as_token_ids", "as_trial_list", "check_trials_tokenizer",
           "load_trials", "save_trials", "trial_set_hash"]

#: trial ids already warned about for lacking a tokenizer fingerprint (one warning per
#: trial: at load_trials, or at the first run that checks it)
_UNCHECKED_WARNED: set[str] = set()


@dataclass(frozen=True)
class Trial:
    """One retrieval trial.

    Attributes:
        tokens: prompt token ids (no generated tokens), length ``N``.
        needle_span: ``(s, e)`` token indices of the scored needle span, end exclusive,
            ``0 <= s < e <= N`` and ``e - s < N`` (one off-needle position at least).
            The whole needle sentence (for NIAH probes too, since the span-per-method
            change; older NIAH trial files stored the ``real_needle`` part here, see
            :meth:`from_dict`).
        answer: the gold answer string (e.g. a character name).
        prompt: the prompt text the tokens came from (``""`` when built from ids).
        meta: free metadata (grid cell, entry id, depth, ...); must be JSON-serialisable.
        trial_id: a stable id; defaults to a hash of tokens, span(s) and answer.
        answer_span: ``(a, b)`` token span of the answer part inside the needle (NIAH:
            the tokens of ``real_needle``), or None when the trial has no separate
            answer part (then :meth:`span` ``("answer")`` is the needle span).
            Detectors read the span they declare (``Detector.span``): the Wu copy score
            and HeadKV the answer span, LOCOS, attention-spatial, DLA and the HeadKV
            anchor variant the needle span (docs/concepts.md, protocol table).
        tokenizer_fingerprint: :func:`locos_tl.tokenize.tokenizer_fingerprint` of the
            tokenizer whose ids ``tokens`` are (16 hex digits), or ``""`` when unknown
            (trials written before locos_tl recorded it, ``Trial(tokens=...)`` built by
            hand: see :meth:`with_tokenizer`). Runs refuse a trial whose fingerprint
            differs from the model's tokenizer's (:func:`check_trials_tokenizer`). Not
            part of :attr:`trial_id`.
        tokenizer_name: that tokenizer's name, for messages (``name_or_path``, a
            registry name, or the organism vocabulary's name); not compared by ``==``.

    Raises:
        TrialError: on ``tokens`` that are not a sequence of non-negative integer ids
            (a string, None, floats: the message names the field), a span that is not
            a ``(start, end)`` pair of integers, a non-string answer, an empty
            answer, an empty prompt, or a needle span that is
            empty, outside the prompt or covering the whole prompt (no off-needle
            position is left for the contrast of arXiv 2607.01002 Eq. 3); an answer
            span that is empty or outside the prompt; a tokenizer fingerprint or
            name that is not a string.
    """

    # tokens and spans are annotated Any so that a wrong type (None, a str, floats, a
    # numpy array) reaches __post_init__'s TrialError instead of a type-checker error
    tokens: Any  # Sequence[int]; stored as a tuple of ints
    needle_span: Any  # Sequence[int]; stored as a (s, e) tuple
    answer: str
    prompt: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    trial_id: str = ""
    answer_span: Any = None  # Sequence[int] | None; stored as a (a, b) tuple or None
    # str (annotated Any, as tokens: a wrong type reaches __post_init__'s TrialError)
    tokenizer_fingerprint: Any = ""
    tokenizer_name: Any = field(default="", compare=False)  # a label: not compared

    def __post_init__(self) -> None:
        for attr in ("tokenizer_fingerprint", "tokenizer_name"):
            v = getattr(self, attr)
            if v is None:
                object.__setattr__(self, attr, "")
            elif not isinstance(v, str):
                raise TrialError(f"Trial.{attr} must be a str, got {type(v).__name__} {v!r}"
                                 [:200])
        object.__setattr__(self, "tokens", as_token_ids(self.tokens, "Trial.tokens"))
        if not self.tokens:
            raise TrialError("trial has an empty prompt (no tokens): Trial.tokens is empty")
        n = len(self.tokens)
        s, e = as_span(self.needle_span, n, "Trial.needle_span", name="needle span")
        object.__setattr__(self, "needle_span", (s, e))
        if not isinstance(self.answer, str):
            raise TrialError(f"Trial.answer must be a str (the gold answer), got "
                             f"{type(self.answer).__name__} {self.answer!r}")
        if not self.answer or not self.answer.strip():
            raise TrialError("trial has an empty gold answer")
        if e - s >= n:
            raise TrialError(
                f"needle span [{s}, {e}) covers the whole prompt of {n} "
                "tokens: LOCOS needs at least one off-needle position (Eq. 3 rescales "
                "the off-needle mass by n / (N_t - n), undefined at the first step)"
            )
        if self.answer_span is not None:
            object.__setattr__(self, "answer_span", as_span(
                self.answer_span, n, "Trial.answer_span", name="answer span"))
        if not self.trial_id:
            object.__setattr__(self, "trial_id", self.content_hash())

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def span(self, which: str) -> tuple[int, int]:
        """The token span ``(s, e)`` named ``which``.

        Args:
            which: ``"needle"`` (the whole needle, :attr:`needle_span`) or ``"answer"``
                (:attr:`answer_span`; the needle span when the trial has none).

        Raises:
            ValueError: another name.
        """
        if which == "needle":
            return self.needle_span  # type: ignore[return-value]
        if which == "answer":
            return (self.answer_span or self.needle_span)  # type: ignore[return-value]
        raise ValueError(f"unknown span {which!r}; use 'needle' or 'answer'")

    def with_tokenizer(self, tokenizer: Any) -> Trial:
        """This trial marked as tokenized by ``tokenizer`` (a copy; same :attr:`trial_id`).

        For trials built by hand from ids (``Trial(tokens=model.to_tokens(...))``) or
        read from a file written before trials carried a fingerprint, when you know which
        tokenizer made them: runs then check it against the model's.

        Args:
            tokenizer: a Hugging Face tokenizer, a TransformerBridge (its tokenizer), or a
                :class:`~locos_tl.tokenize.TokenizerIdentity`.

        Raises:
            TrialError: a token id is not in ``tokenizer``'s vocabulary.
            TypeError: ``tokenizer`` is not a tokenizer.
        """
        ident = identity_of_tokens(self, tokenizer)
        return replace(self, tokenizer_fingerprint=ident.fingerprint,
                       tokenizer_name=ident.name)

    def content_hash(self) -> str:
        """Short SHA-256 of tokens, span(s) and answer (identifies a trial across runs).

        The tokenizer fingerprint does not enter: trials written before it was recorded
        keep their ids, and runs over them resume. The answer span enters only when it
        differs from the needle span, so trials without one (and legacy NIAH trials, see
        :meth:`from_dict`) keep their ids."""
        h = hashlib.sha256()
        parts: list[Any] = [list(self.tokens), list(self.needle_span), self.answer]
        if self.answer_span is not None and tuple(self.answer_span) != tuple(self.needle_span):
            parts.append(list(self.answer_span))
        h.update(json.dumps(parts).encode())
        return h.hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tokens"] = list(self.tokens)
        d["needle_span"] = list(self.needle_span)
        d["answer_span"] = None if self.answer_span is None else list(self.answer_span)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trial:
        """Rebuild a trial from :meth:`to_dict` output.

        Files written before trials carried an answer span load unchanged. A legacy
        NIAH record (``meta.task == "niah"``, no ``answer_span`` key) stored the
        ``real_needle`` tokens as its needle span: that span becomes the answer span
        too, and a ``UserWarning`` says that LOCOS, attention-spatial and DLA then read
        the ``real_needle`` part instead of the whole needle (rebuild the trials with
        ``locos build-trials niah`` for the published spans). A record without
        ``tokenizer_fingerprint`` (written before trials carried one) loads with an empty
        one; :func:`load_trials` warns about it.

        Raises:
            TrialError: a required field is missing or a span is invalid.
        """
        missing = [k for k in ("tokens", "needle_span", "answer") if k not in d]
        if missing:
            raise TrialError(f"trial record lacks field(s) {missing}")
        meta = dict(d.get("meta", {}))
        answer_span = d.get("answer_span")
        if "answer_span" not in d and meta.get("task") == "niah":
            warn_caller(
                "NIAH trial written before per-method spans: its needle span is the "
                "real_needle part, so every method reads that span (the authors score "
                "LOCOS, attention-spatial and DLA on the whole needle); rebuild the "
                "trials with `locos build-trials niah` for the published spans",
                UserWarning)
            answer_span = d["needle_span"]
        return cls(
            tokens=tuple(d["tokens"]),
            needle_span=tuple(d["needle_span"]),  # type: ignore[arg-type]
            answer=d["answer"],
            prompt=d.get("prompt", ""),
            meta=meta,
            trial_id=d.get("trial_id", ""),
            answer_span=None if answer_span is None else tuple(answer_span),
            tokenizer_fingerprint=d.get("tokenizer_fingerprint") or "",
            tokenizer_name=d.get("tokenizer_name") or "",
        )

    @classmethod
    def from_text(
        cls,
        tokenizer: Any,
        prompt: str,
        needle: str,
        answer: str,
        *,
        n_ctx: int | None = None,
        meta: dict[str, Any] | None = None,
        add_special_tokens: bool = True,
    ) -> Trial:
        """Tokenize ``prompt`` and find the token span of ``needle`` inside it.

        The prompt is tokenized by :func:`locos_tl.tokenize.encode_prompt`: the
        checkpoint's own tokenizer, BOS exactly once and only at position 0 (none for
        checkpoints whose tokenizer adds none; no second one when ``prompt`` was
        rendered with a chat template that writes it). The trial records that
        tokenizer's fingerprint and name (:attr:`tokenizer_fingerprint`). A bridge's
        tokenizer and the checkpoint directory's give the same tokens, span and
        fingerprint. The span is found from the character offsets: the needle's first
        occurrence in ``prompt`` must start and end on token boundaries (a leading or
        trailing space that a token absorbs is allowed).

        Args:
            tokenizer: a Hugging Face fast tokenizer (``return_offsets_mapping``) or a
                TransformerBridge / model with a ``.tokenizer``.
            prompt: the full prompt text.
            needle: the text of the needle span (must occur in ``prompt``).
            answer: gold answer string.
            n_ctx: the model's context length; longer prompts are rejected.
            meta: free metadata.
            add_special_tokens: apply the checkpoint's BOS rule (default); ``False``
                adds no special token (``encode_prompt(..., bos="none")``).

        Raises:
            TrialError: needle absent from the prompt; needle not aligned to whole tokens
                (the message names the characters); empty answer; prompt longer than
                ``n_ctx``; a BOS inside the prompt after position 0.
        """
        if not answer or not answer.strip():
            raise TrialError("empty gold answer")
        ids, (s, e), ident = tokenize_needle(tokenizer, prompt, needle, n_ctx=n_ctx,
                                             add_special_tokens=add_special_tokens)
        return cls(tokens=tuple(ids), needle_span=(s, e), answer=answer, prompt=prompt,
                   meta=dict(meta or {}), tokenizer_fingerprint=ident.fingerprint,
                   tokenizer_name=ident.name)


def as_token_ids(tokens: Any, what: str) -> tuple[int, ...]:
    """``tokens`` as a tuple of non-negative Python ints (numpy and torch integers too).

    Args:
        tokens: a sequence of token ids.
        what: the argument's name, for the message (e.g. ``"Trial.tokens"``).

    Raises:
        TrialError: a string, a non-sequence, or a non-integer or negative id (the
            message names ``what`` and the index)."""
    if isinstance(tokens, (str, bytes)):
        raise TrialError(
            f"{what} must be a sequence of token ids (ints), got a "
            f"{type(tokens).__name__} {tokens[:40]!r}; tokenize the text first "
            "(Trial.from_text, or locos_tl.tokenize.encode_prompt)")
    if isinstance(tokens, Mapping) or not isinstance(tokens, Iterable):
        raise TrialError(f"{what} must be a sequence of token ids (ints), got "
                         f"{type(tokens).__name__} {tokens!r}"[:200])
    out = tuple(as_int(t, f"{what}[{i}]", TrialError) for i, t in enumerate(tokens))
    for i, t in enumerate(out):
        if t < 0:
            raise TrialError(f"{what}[{i}] = {t} is negative (not a token id)")
    return out


def as_span(
    span: Any, n: int, what: str, *, name: str | None = None, within: str | None = None,
    error: type[Exception] = TrialError,
) -> tuple[int, int]:
    """``span`` as a ``(start, end)`` pair of ints with ``0 <= start < end <= n`` (end
    exclusive): the one check of a token span (a trial's needle and answer spans, the
    position windows of :mod:`locos_tl.plot`).

    Args:
        span: a ``(start, end)`` pair (tuple, list; Python, numpy or 0-d torch ints).
        n: the number of positions the span must lie in.
        what: the argument's name, for the messages (``"Trial.needle_span"``).
        name: how the bounds message calls the span (default ``what``).
        within: what the ``n`` positions are, for the message (default
            ``"the prompt of {n} tokens"``).
        error: the exception class raised.

    Raises:
        TrialError: (or ``error``) not a pair, a non-integer bound, or a span that is
            empty or outside ``[0, n)``; the message names ``what`` (or ``name``).
    """
    if isinstance(span, (str, bytes, Mapping)) or not isinstance(span, Iterable):
        raise error(f"{what} must be a (start, end) pair of token indices, "
                    f"got {type(span).__name__} {span!r}"[:200])
    pair = list(span)
    if len(pair) != 2:
        raise error(f"{what} must be a (start, end) pair of token indices, "
                    f"got {len(pair)} value(s) {pair!r}"[:200])
    a, b = as_int(pair[0], f"{what} start", error), as_int(pair[1], f"{what} end", error)
    if not 0 <= a < b <= n:
        raise error(f"{name or what} ({a}, {b}) must satisfy 0 <= start < end <= {n}: not "
                    f"inside {within or f'the prompt of {n} tokens'}"
                    + (" (it is empty)" if b <= a else ""))
    return a, b


def as_trial_list(trials: Any, where: str) -> list[Trial]:
    """``trials`` as a list, refusing one bare :class:`Trial` and non-trial items.

    Args:
        trials: a sequence (or any iterable) of :class:`Trial`.
        where: the calling function's name, for the message.

    Raises:
        TrialError: ``trials`` is one Trial (pass ``[trial]``), a string, a mapping or
            not iterable, or an item is not a Trial (the message names its index).
    """
    if isinstance(trials, Trial):
        raise TrialError(f"{where}() got one Trial: pass a list of trials, e.g. [trial]")
    if isinstance(trials, (str, bytes, Mapping)) or not isinstance(trials, Iterable):
        raise TrialError(f"{where}() needs a list of trials, got {type(trials).__name__}: "
                         "pass a list of trials (build them with locos_tl.build_*_trials, "
                         "Trial(...) or load_trials)")
    out = list(trials)
    for i, t in enumerate(out):
        if not isinstance(t, Trial):
            raise TrialError(f"{where}(): trials[{i}] is a {type(t).__name__}, not a Trial: "
                             "pass a list of trials (build them with "
                             "locos_tl.build_*_trials, Trial(...) or load_trials)")
    return out


def save_trials(trials: Iterable[Trial], path: str | Path) -> Path:
    """Write trials as JSON lines (one :meth:`Trial.to_dict` per line, with the
    ``tokenizer_fingerprint`` and ``tokenizer_name`` of each trial)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for t in trials:
            f.write(json.dumps(t.to_dict()) + "\n")
    return path


def load_trials(
    path: str | Path, tokenizer: Any = None, *, n_ctx: int | None = None
) -> list[Trial]:
    """Read trials from JSON lines.

    Each line is either a full trial record (``tokens``, ``needle_span``, ``answer``)
    or a text record (``prompt``, ``needle``, ``answer``), which needs ``tokenizer``
    and is tokenized by :meth:`Trial.from_text` (the checkpoint's BOS rule of
    :func:`locos_tl.tokenize.encode_prompt`: a prompt already rendered with a chat
    template that writes the BOS gets no second one).

    Token records carry the fingerprint of the tokenizer that built them
    (:attr:`Trial.tokenizer_fingerprint`); with ``tokenizer`` given, a record made by
    another tokenizer is refused here. A file written before trials carried a
    fingerprint loads, with one ``UserWarning`` naming the file (its trials are not
    warned about again when they run).

    Raises:
        TrialError: malformed line (names the line number), a text record without a
            tokenizer, or (with a tokenizer) a token record holding the checkpoint's BOS
            after position 0 or built by another tokenizer (the message names both).
    """
    path = Path(path)
    if not path.exists():
        raise TrialError(f"trials file {path} does not exist")
    out: list[Trial] = []
    own = tokenizer_of_file(tokenizer)
    unchecked: list[str] = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TrialError(f"{path}:{i}: not valid JSON ({exc})") from exc
        try:
            if "tokens" in d:
                t = Trial.from_dict(d)
                if n_ctx is not None and t.n_tokens > n_ctx:
                    raise TrialError(
                        f"prompt has {t.n_tokens} tokens, longer than n_ctx={n_ctx}"
                    )
                check_record_tokenizer(t, own, tokenizer, unchecked)
            else:
                missing = [k for k in ("prompt", "needle", "answer") if k not in d]
                if missing:
                    raise TrialError(f"record lacks field(s) {missing}")
                if tokenizer is None:
                    raise TrialError("text records (prompt/needle/answer) need a tokenizer")
                t = Trial.from_text(tokenizer, d["prompt"], d["needle"], d["answer"],
                                    n_ctx=n_ctx, meta=d.get("meta"))
        except TrialError as exc:
            raise TrialError(f"{path}:{i}: {exc}") from exc
        out.append(t)
    warn_unchecked_file(path, unchecked, len(out), _UNCHECKED_WARNED)
    return out


def check_trials_tokenizer(model: Any, trials: Sequence[Trial]) -> None:
    """Refuse trials built by another tokenizer than ``model``'s (before any forward).

    Compares each trial's :attr:`Trial.tokenizer_fingerprint` with
    :func:`locos_tl.tokenize.tokenizer_fingerprint` of the model's tokenizer. Trials
    without a fingerprint (older files, ``Trial(tokens=...)``) run, with one
    ``UserWarning`` for those not already warned about by :func:`load_trials`. Nothing is
    checked for a model without a tokenizer.

    Args:
        model: a TransformerBridge (or an object with a ``.tokenizer``, or a
            ``tokenizer_identity``: :func:`locos_tl.tokenize.model_tokenizer_identity`).
        trials: the trials.

    Raises:
        TrialError: a trial whose fingerprint differs from the model's tokenizer's; the
            message names both tokenizers and how many trials differ.
    """
    check_tokenizer(model, trials, _UNCHECKED_WARNED)


def trial_set_hash(trials: Sequence[Trial]) -> str:
    """SHA-256 over the trial ids, in order (provenance of a scoring run)."""
    h = hashlib.sha256()
    for t in trials:
        h.update(t.trial_id.encode())
    return h.hexdigest()[:16]
