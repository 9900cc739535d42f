"""Haystacks: plain-text books, sentence boundaries and loading.

A haystack is the filler text a needle is hidden in (Modarressi et al. 2025, NoLiMa,
arXiv 2502.05167; Wu et al. 2025, arXiv 2404.15574). This module only reads books
and finds sentence boundaries; :mod:`locos_tl.data.prompt` cuts them to an exact
token length and inserts needles.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from locos_tl.errors import DataFormatError

# A sentence ends with . ! or ? (optionally followed by closing quotes/brackets) and
# whitespace; a paragraph break (blank line) also starts a new sentence.
#: The haystack shipped with locos_tl: self-written plain prose, about 2,500 words, no
#: named people (the real-model demo and the protocol's detection trials).
PROSE_HAYSTACK = Path(__file__).parent / "haystacks" / "everyday_prose.txt"

_LINE_WRAP = re.compile(r"(?<![\n])[ \t]*\n[ \t]*(?![\n \t])")
_SENTENCE_END = re.compile(r"[.!?][\"'\u201d\u2019)\]]*\s+|\n[ \t]*\n\s*")


@dataclass(frozen=True)
class Haystack:
    """One plain-text book used as haystack.

    Attributes:
        text: the book text (newlines normalised to ``\\n``, outer whitespace stripped).
        name: a short name (the file name), recorded in each trial's ``meta``.
        index: the haystack index (position in the list of books); enters NoLiMa's
            seed rule ``42 + int(id[:4]) + index``.
        sentence_starts: sorted character offsets at which a sentence begins (the
            first non-space character after a sentence end or a blank line); always
            contains ``0``.
    """

    text: str
    name: str
    index: int = 0
    sentence_starts: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.text.strip():
            raise DataFormatError(f"haystack {self.name!r} is empty")
        if not self.sentence_starts:
            object.__setattr__(self, "sentence_starts", tuple(sentence_starts(self.text)))

    @classmethod
    def from_text(
        cls, text: str, name: str = "haystack", index: int = 0, *, unwrap: bool = True
    ) -> Haystack:
        """Build a haystack from a string (newlines normalised, outer space stripped).

        Args:
            text: the book text.
            name: recorded in trials.
            index: haystack index (NoLiMa seed rule).
            unwrap: join hard-wrapped lines (a single newline inside a paragraph becomes
                a space; blank lines are kept). Project Gutenberg books wrap at ~70
                characters; unwrapped prose tokenises like running text, and a cut at a
                line end can no longer drop a newline token.

        Raises:
            DataFormatError: the text is empty.
        """
        return cls(text=_normalise(text, unwrap), name=name, index=index)


def sentence_starts(text: str) -> list[int]:
    """Character offsets where sentences begin in ``text`` (sorted, starts with 0).

    A boundary is the first non-whitespace character after ``.``, ``!`` or ``?``
    (plus closing quotes) followed by whitespace, or after a blank line. The
    character before every boundary except 0 is whitespace, so a needle inserted at a
    boundary starts a new word (token-aligned in byte-level BPE and SentencePiece).
    """
    starts = [0]
    n = len(text)
    for m in _SENTENCE_END.finditer(text):
        pos = m.end()
        if 0 < pos < n and pos != starts[-1]:
            starts.append(pos)
    return starts


def load_haystack(path: str | Path, index: int = 0, *, unwrap: bool = True) -> Haystack:
    """Read one plain-text book (UTF-8) as a haystack.

    Args:
        path: the text file.
        index: the haystack index recorded in trials (NoLiMa seed rule).
        unwrap: join hard-wrapped lines (see :meth:`Haystack.from_text`).

    Raises:
        DataFormatError: the file is missing, not UTF-8 or empty.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"haystack file {path} does not exist")
    try:
        raw = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataFormatError(f"haystack file {path} is not UTF-8 text ({exc})") from exc
    if not raw.strip():
        raise DataFormatError(f"haystack file {path} is empty")
    return Haystack.from_text(raw, name=path.name, index=index, unwrap=unwrap)


def load_haystacks(paths: Iterable[str | Path], *, unwrap: bool = True) -> list[Haystack]:
    """Read several books; book ``i`` gets haystack index ``i``.

    Raises:
        DataFormatError: no paths, or any file missing/empty/not UTF-8.
    """
    out = [load_haystack(p, index=i, unwrap=unwrap) for i, p in enumerate(paths)]
    if not out:
        raise DataFormatError("no haystack files given")
    return out


def _normalise(text: str, unwrap: bool = True) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n").strip()
    if unwrap:
        text = _LINE_WRAP.sub(" ", text)
    return text
