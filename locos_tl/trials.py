"""Retrieval trials: a tokenized prompt, its needle span and the gold answer.

A :class:`Trial` is the unit every scorer, ablation sweep and patching run consumes
(Gema, Alex & Minervini 2026, arXiv 2607.01002, Sec. 3: "a prompt of N tokens that
contains a needle span [s, e) and a gold answer").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from locos_tl.errors import TrialError


@dataclass(frozen=True)
class Trial:
    """One retrieval trial.

    Attributes:
        tokens: prompt token ids (no generated tokens), length ``N``.
        needle_span: ``(s, e)`` token indices of the scored needle span, end exclusive,
            ``0 <= s < e <= N``. For NIAH probes this is the ``real_needle`` part.
        answer: the gold answer string (e.g. a character name).
        prompt: the prompt text the tokens came from (``""`` when built from ids).
        meta: free metadata (grid cell, entry id, depth, ...); must be JSON-serialisable.
        trial_id: a stable id; defaults to a hash of tokens, span and answer.

    Raises:
        TrialError: on an empty answer, an empty prompt or a span outside the prompt.
    """

    tokens: Sequence[int]  # stored as a tuple of ints
    needle_span: Sequence[int]  # stored as a (s, e) tuple
    answer: str
    prompt: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    trial_id: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))
        s, e = (int(x) for x in self.needle_span)
        object.__setattr__(self, "needle_span", (s, e))
        if not self.tokens:
            raise TrialError("trial has an empty prompt (no tokens)")
        if not self.answer or not self.answer.strip():
            raise TrialError("trial has an empty gold answer")
        if not 0 <= s < e <= len(self.tokens):
            raise TrialError(
                f"needle span [{s}, {e}) is not inside the prompt of {len(self.tokens)} tokens"
            )
        if not self.trial_id:
            object.__setattr__(self, "trial_id", self.content_hash())

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def content_hash(self) -> str:
        """Short SHA-256 of tokens, span and answer (identifies a trial across runs)."""
        h = hashlib.sha256()
        h.update(json.dumps([list(self.tokens), list(self.needle_span), self.answer]).encode())
        return h.hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tokens"] = list(self.tokens)
        d["needle_span"] = list(self.needle_span)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trial:
        missing = [k for k in ("tokens", "needle_span", "answer") if k not in d]
        if missing:
            raise TrialError(f"trial record lacks field(s) {missing}")
        return cls(
            tokens=tuple(d["tokens"]),
            needle_span=tuple(d["needle_span"]),  # type: ignore[arg-type]
            answer=d["answer"],
            prompt=d.get("prompt", ""),
            meta=dict(d.get("meta", {})),
            trial_id=d.get("trial_id", ""),
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

        The span is found from the tokenizer's character offsets: the needle's first
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
            add_special_tokens: let the tokenizer add BOS etc.

        Raises:
            TrialError: needle absent from the prompt; needle not aligned to whole tokens
                (the message names the characters); empty answer; prompt longer than
                ``n_ctx``.
        """
        tokenizer = getattr(tokenizer, "tokenizer", None) or tokenizer
        if not answer or not answer.strip():
            raise TrialError("empty gold answer")
        if not needle or not needle.strip():
            raise TrialError("empty needle text")
        start = prompt.find(needle)
        if start < 0:
            raise TrialError(f"needle {needle[:60]!r} not found in the prompt text")
        end = start + len(needle)
        enc = tokenizer(prompt, return_offsets_mapping=True, add_special_tokens=add_special_tokens)
        ids = list(enc["input_ids"])
        offsets = [tuple(o) for o in enc["offset_mapping"]]
        if n_ctx is not None and len(ids) > n_ctx:
            raise TrialError(
                f"prompt has {len(ids)} tokens, longer than the model's context n_ctx={n_ctx}"
            )
        s, e = span_from_offsets(offsets, start, end, prompt)
        return cls(tokens=tuple(ids), needle_span=(s, e), answer=answer, prompt=prompt,
                   meta=dict(meta or {}))


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


def save_trials(trials: Iterable[Trial], path: str | Path) -> Path:
    """Write trials as JSON lines (one :meth:`Trial.to_dict` per line)."""
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
    or a text record (``prompt``, ``needle``, ``answer``), which needs ``tokenizer``.

    Raises:
        TrialError: malformed line (names the line number), or a text record without a
            tokenizer.
    """
    path = Path(path)
    if not path.exists():
        raise TrialError(f"trials file {path} does not exist")
    out: list[Trial] = []
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
    return out


def trial_set_hash(trials: Sequence[Trial]) -> str:
    """SHA-256 over the trial ids, in order (provenance of a scoring run)."""
    h = hashlib.sha256()
    for t in trials:
        h.update(t.trial_id.encode())
    return h.hexdigest()[:16]
