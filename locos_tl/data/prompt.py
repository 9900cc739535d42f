"""Exact-length prompts: cut a haystack so the whole prompt has N tokens, insert needles.

The whole prompt (system prompt, task template, haystack, question and, optionally,
the model's chat template) is made exactly ``length`` tokens long in the model's own
tokenizer, and the needle goes in at the sentence boundary nearest the requested
depth, as in NoLiMa (Modarressi et al. 2025, arXiv 2502.05167) and the
needle-in-a-haystack probes of Wu et al. (2025, arXiv 2404.15574).

How: each book is tokenised once with character offsets; a prompt with ``n`` book
tokens uses the book's first ``n`` tokens (cut on a token boundary by offsets). ``n``
starts from an estimate and is corrected by the measured length of the full prompt
(a few tokenisations per trial), then the needle span is checked to be whole tokens.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from locos_tl.data.haystack import Haystack
from locos_tl.data.placement import _Book, _covering_span, _insert
from locos_tl.errors import DataFormatError, TrialError
from locos_tl.tokenize import checkpoint_tokenizer, encode_prompt, tokenizer_identity
from locos_tl.trial_tokenizer import span_from_offsets
from locos_tl.trials import Trial


class HaystackTooShortError(TrialError):
    """The haystack has fewer tokens than the requested prompt length needs."""


@dataclass(frozen=True)
class PromptTemplate:
    """How the prompt around the haystack is written.

    Attributes:
        task_template: user-turn text with a ``{haystack}`` and a ``{question}`` slot.
        system_prompt: system text; with a chat template it is the system turn, without
            one it is prepended to the user text followed by a blank line.
        chat_template: render with ``tokenizer.apply_chat_template`` (generation prompt
            added, ``enable_thinking=False`` passed so templates that support it do not
            open a thinking block). Either way the text is tokenized under the one BOS
            rule (:func:`locos_tl.tokenize.encode_prompt`): the checkpoint's BOS once at
            position 0, not added again when the template writes it.

    Raises:
        DataFormatError: the task template lacks the ``{haystack}`` or ``{question}``
            slot, or has ``{haystack}`` more than once.
    """

    task_template: str
    system_prompt: str = ""
    chat_template: bool = False

    def __post_init__(self) -> None:
        if self.task_template.count("{haystack}") != 1:
            raise DataFormatError(
                "task template must contain exactly one {haystack} slot: "
                f"{self.task_template[:80]!r}"
            )
        if "{question}" not in self.task_template:
            raise DataFormatError(
                f"task template has no {{question}} slot: {self.task_template[:80]!r}"
            )


@dataclass(frozen=True)
class Insert:
    """A text inserted into the haystack at a sentence boundary.

    Attributes:
        text: the inserted sentence(s) (e.g. the needle or a distractor).
        depth: requested position in percent (0 = start, 100 = end) of the haystack
            part of the prompt.
        score: character range ``[a, b)`` inside ``text`` whose tokens form the trial's
            needle span; ``None`` for inserts that are not scored (distractors).
        strict: the scored range must be whole tokens (else :class:`TrialError`);
            when ``False`` the span widens to the tokens covering the range (for a
            NIAH ``real_needle`` that ends inside a word-plus-punctuation token).
        answer: character range ``[a, b)`` inside ``text`` of the answer part (NIAH:
            ``real_needle``); its covering tokens become the trial's ``answer_span``
            (read by the Wu copy score and HeadKV). ``None``: no separate answer span.
    """

    text: str
    depth: float | int
    score: tuple[int, int] | None = None
    strict: bool = True
    answer: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if not self.text.strip():
            raise DataFormatError("inserted text (needle or distractor) is empty")
        if not 0.0 <= float(self.depth) <= 100.0:
            raise DataFormatError(f"depth {self.depth} is outside 0..100 (percent)")
        for what, rng in (("scored", self.score), ("answer", self.answer)):
            if rng is not None and not 0 <= rng[0] < rng[1] <= len(self.text):
                raise DataFormatError(
                    f"{what} range [{rng[0]}, {rng[1]}) is outside the inserted text "
                    f"of {len(self.text)} characters"
                )


@dataclass
class _Rendered:
    prompt: str
    ids: list[int]
    offsets: Sequence[tuple[int, int]]  # as the tokenizer returns them
    hay_start: int  # char offset of the haystack inside the prompt
    hay_len: int
    insert_starts: list[int]  # char offset of each insert inside the haystack
    n_book: int
    book_start: int


class PromptBuilder:
    """Builds exact-length trials from haystacks for one tokenizer.

    Args:
        tokenizer: a Hugging Face fast tokenizer (needs ``return_offsets_mapping``) or
            an object with a ``.tokenizer`` (TransformerBridge); the checkpoint's own
            tokenizer behind it is used (:func:`locos_tl.tokenize.checkpoint_tokenizer`),
            so a bridge and ``--tokenizer DIR`` build the same trials.
        max_tries: tokenisations allowed per trial to reach the exact length.
        boundary_tries: how many nearest sentence boundaries to try when the needle is
            not token-aligned at the nearest one.
        start_tries: how many haystack starts (the book's first sentences) to try when a
            merge at the cut makes the exact length unreachable from the first one.

    Raises:
        DataFormatError: the tokenizer cannot return character offsets.
    """

    def __init__(
        self, tokenizer: Any, *, max_tries: int = 16, boundary_tries: int = 4, start_tries: int = 6
    ) -> None:
        tok = getattr(tokenizer, "tokenizer", None) or tokenizer
        if not getattr(tok, "is_fast", True):
            raise DataFormatError(
                "a fast tokenizer (with character offsets) is needed to build trials"
            )
        self.tokenizer = checkpoint_tokenizer(tok)
        self._identity: Any = None  # the tokenizer's fingerprint, computed once
        self.max_tries = max_tries
        self.boundary_tries = boundary_tries
        self.start_tries = start_tries
        self._books: dict[tuple[str, str], _Book] = {}

    # ------------------------------------------------------------------ public
    def n_tokens(self, haystack: Haystack) -> int:
        """Length of a haystack in this tokenizer's tokens (no special tokens)."""
        return len(self._book(haystack).ends)

    def build(
        self,
        haystack: Haystack,
        *,
        length: int,
        template: PromptTemplate,
        question: str,
        needle: Insert,
        answer: str,
        others: Sequence[Insert] = (),
        meta: dict[str, Any] | None = None,
    ) -> Trial:
        """Build one trial whose prompt is exactly ``length`` tokens long.

        Args:
            haystack: the book to cut (its first tokens are used; if the exact length is
                unreachable, the haystack starts at the book's second sentence, ...).
            length: total prompt length in tokens, special tokens and chat template
                included.
            template: the prompt around the haystack.
            question: the question text (fills ``{question}``).
            needle: the scored insert (``score`` defaults to the whole text).
            answer: gold answer string.
            others: further inserts (e.g. a NoLiMa distractor or distractor needles),
                not scored; the token span each one covers goes to
                ``meta["insert_spans"]`` (in the order given).
            meta: grid-cell metadata copied into the trial; the builder adds
                ``length``, ``depth``, ``depth_actual`` (percent of the haystack
                tokens before the needle), ``haystack``, ``haystack_index``,
                ``n_haystack_tokens`` (book tokens used) and ``haystack_start`` (the
                book character offset the haystack starts at) and ``query_start``
                (the first token after the haystack: where the question part starts,
                as :mod:`locos_tl.experiments.compress` reads it).

        Returns:
            a :class:`~locos_tl.trials.Trial` with ``len(tokens) == length`` and
            ``needle_span`` covering the scored text (and ``answer_span`` covering the
            needle's ``answer`` range, when it has one).

        Raises:
            HaystackTooShortError: the haystack is too short for ``length`` (the
                message gives its length in tokens and characters).
            TrialError: ``length`` is shorter than the prompt without haystack, the
                exact length cannot be reached, or the needle is not token-aligned at
                any of the nearest sentence boundaries.
            DataFormatError: the chat template is missing or rewrites the haystack.
        """
        if needle.score is None:
            needle = replace(needle, score=(0, len(needle.text)))
        inserts = [needle, *others]
        last_err: TrialError | None = None
        for rank in range(self.boundary_tries):
            r = self._fit_length(haystack, length, template, question, inserts, rank)
            r.offsets = [(int(x), int(y)) for x, y in r.offsets]
            a = r.hay_start + r.insert_starts[0] + needle.score[0]  # type: ignore[index]
            b = r.hay_start + r.insert_starts[0] + needle.score[1]  # type: ignore[index]
            try:
                if needle.strict:
                    s, e = span_from_offsets(r.offsets, a, b, r.prompt)
                else:
                    s, e = _covering_span(r.offsets, a, b)
            except TrialError as exc:
                last_err = exc
                continue
            ans = None
            if needle.answer is not None:  # the answer part: covering tokens
                base = r.hay_start + r.insert_starts[0]
                ans = _covering_span(r.offsets, base + needle.answer[0], base + needle.answer[1])
            if others:  # where each further insert landed, as token spans
                meta = {**(meta or {}), "insert_spans": [
                    list(_covering_span(r.offsets, r.hay_start + r.insert_starts[i + 1],
                                        r.hay_start + r.insert_starts[i + 1] + len(o.text)))
                    for i, o in enumerate(others)]}
            return self._trial(r, s, e, haystack, length, needle, answer, meta, ans)
        raise TrialError(
            f"needle not token-aligned at the {self.boundary_tries} sentence boundaries "
            f"nearest depth {needle.depth} in {haystack.name!r}: {last_err}"
        )

    # ----------------------------------------------------------------- helpers
    def _book(self, haystack: Haystack) -> _Book:
        key = (haystack.name, haystack.text)
        book = self._books.get(key)
        if book is None:
            enc = self.tokenizer(
                haystack.text, add_special_tokens=False, return_offsets_mapping=True,
                verbose=False,
            )
            ends: list[int] = []
            last = 0
            for _a, b in enc["offset_mapping"]:
                last = max(last, int(b))
                ends.append(last)
            book = _Book(tuple(ends))
            self._books[key] = book
        return book

    def _fit_length(
        self,
        haystack: Haystack,
        length: int,
        template: PromptTemplate,
        question: str,
        inserts: list[Insert],
        rank: int,
    ) -> _Rendered:
        book = self._book(haystack)
        best: tuple[int, int] | None = None  # (distance, count) of the closest miss
        hint: tuple[int, int] | None = None  # (t0, n) of the closest miss so far
        # A merge at the cut can make one more book token worth 0 or 2 prompt tokens,
        # so some lengths are unreachable for a given start; starting the haystack one
        # sentence later shifts those gaps elsewhere.
        for skip in range(min(self.start_tries, len(haystack.sentence_starts))):
            r, closest, hint = self._fit_from(haystack, book, skip, length, template, question,
                                              inserts, rank, hint)
            if r is not None:
                return r
            if best is None or abs(closest - length) < best[0]:
                best = (abs(closest - length), closest)
        raise TrialError(
            f"could not make the prompt exactly {length} tokens long with haystack "
            f"{haystack.name!r} (closest: {best[1] if best else '?'} tokens)"
        )

    def _fit_from(
        self,
        haystack: Haystack,
        book: _Book,
        skip: int,
        length: int,
        template: PromptTemplate,
        question: str,
        inserts: list[Insert],
        rank: int,
        hint: tuple[int, int] | None,
    ) -> tuple[_Rendered | None, int, tuple[int, int]]:
        start = haystack.sentence_starts[skip]
        t0 = bisect.bisect_right(book.ends, start)
        total = len(book.ends) - t0

        def render(n: int) -> _Rendered:
            return self._render(haystack, book, start, t0, n, template, question, inserts, rank)

        seen: dict[int, int] = {}
        if hint is None:
            base = render(0)
            if len(base.ids) > length:
                raise TrialError(
                    f"requested length {length} is shorter than the prompt without haystack "
                    f"({len(base.ids)} tokens: template, question and needle)"
                )
            seen[0] = len(base.ids)
            n = length - len(base.ids)
        else:  # a later start: the cut moves by as many tokens as the start did
            n = hint[1] + (t0 - hint[0])
        for _ in range(self.max_tries):
            n = min(max(n, 0), total)
            if n in seen:
                break
            r = render(n)
            seen[n] = len(r.ids)
            if len(r.ids) == length:
                return r, length, (t0, n)
            if n == total and len(r.ids) < length:
                raise HaystackTooShortError(
                    f"haystack {haystack.name!r} is too short: it has "
                    f"{len(book.ends)} tokens ({len(haystack.text)} characters) in this "
                    f"tokenizer, but a {length}-token prompt needs about "
                    f"{n + length - len(r.ids) + t0} haystack tokens; use a longer book or "
                    "a shorter length"
                )
            n += length - len(r.ids)
        best = min(seen, key=lambda k: (abs(seen[k] - length), k))
        gap = any(seen.get(m + 1, length + 1) > length > c for m, c in seen.items())
        if not gap:  # not a clean gap: look around the closest cut
            for d in (1, -1, 2, -2):
                m = best + d
                if 0 <= m <= total and m not in seen:
                    r = render(m)
                    seen[m] = len(r.ids)
                    if len(r.ids) == length:
                        return r, length, (t0, m)
        return None, seen[best], (t0, best)

    def _render(
        self,
        haystack: Haystack,
        book: _Book,
        start: int,
        t0: int,
        n: int,
        template: PromptTemplate,
        question: str,
        inserts: list[Insert],
        rank: int,
    ) -> _Rendered:
        cut = book.ends[t0 + n - 1] if n > 0 else start
        src = haystack.text[start:cut].rstrip()
        hay, starts = _insert(src, haystack, book, start, t0, n, inserts, rank)
        prompt, hay_start = self._prompt_text(template, question, hay)
        ids, offsets = encode_prompt(self.tokenizer, prompt)  # the one BOS rule
        return _Rendered(
            prompt=prompt,
            ids=ids,
            offsets=offsets,
            hay_start=hay_start,
            hay_len=len(hay),
            insert_starts=starts,
            n_book=n,
            book_start=start,
        )

    def _prompt_text(self, template: PromptTemplate, question: str, hay: str) -> tuple[str, int]:
        pre, post = template.task_template.split("{haystack}")
        pre = pre.replace("{question}", question)
        post = post.replace("{question}", question)
        user = pre + hay + post
        if not template.chat_template:
            head = template.system_prompt + "\n\n" if template.system_prompt else ""
            return head + user, len(head) + len(pre)
        rendered = self._chat(template.system_prompt, user)
        pos = rendered.find(user)
        if pos >= 0:
            return rendered, pos + len(pre)
        pos = rendered.find(hay) if hay else -1
        if pos < 0:
            raise DataFormatError(
                "the tokenizer's chat template rewrites the user text: the haystack was "
                "not found verbatim in the rendered prompt"
            )
        return rendered, pos

    def _chat(self, system: str, user: str) -> str:
        tok = self.tokenizer
        if not getattr(tok, "chat_template", None):
            raise DataFormatError(
                "the tokenizer has no chat template; build without --chat-template"
            )
        messages = [{"role": "user", "content": user}]
        if system:
            messages.insert(0, {"role": "system", "content": system})
        try:
            out = tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
            )
        except Exception:  # noqa: BLE001 - templates that reject a system turn
            if not system:
                raise
            merged = [{"role": "user", "content": system + "\n\n" + user}]
            out = tok.apply_chat_template(
                merged, tokenize=False, add_generation_prompt=True, enable_thinking=False
            )
        return str(out)

    def _trial(
        self,
        r: _Rendered,
        s: int,
        e: int,
        haystack: Haystack,
        length: int,
        needle: Insert,
        answer: str,
        meta: dict[str, Any] | None,
        answer_span: tuple[int, int] | None = None,
    ) -> Trial:
        hs, he = _covering_span(r.offsets, r.hay_start, r.hay_start + r.hay_len)
        room = max(1, (he - hs) - (e - s))
        out = dict(meta or {})
        out.update(
            length=length,
            depth=float(needle.depth),
            depth_actual=round(100.0 * (s - hs) / room, 2),
            haystack=haystack.name,
            haystack_index=haystack.index,
            n_haystack_tokens=r.n_book,
            haystack_start=r.book_start,
            # first position after the haystack: the question and the rest of the
            # template, which KV-cache compression keeps whole (locos_tl.experiments.compress)
            query_start=int(he),
        )
        if self._identity is None:
            self._identity = tokenizer_identity(self.tokenizer)
        return Trial(tokens=tuple(r.ids), needle_span=(s, e), answer=answer, prompt=r.prompt,
                     meta=out, answer_span=answer_span,
                     tokenizer_fingerprint=self._identity.fingerprint,
                     tokenizer_name=self._identity.name)
