"""Books and sentence boundaries."""

from __future__ import annotations

import re

import pytest

from locos_tl.data import Haystack, load_haystack, load_haystacks, sentence_starts
from locos_tl.errors import DataFormatError


def test_sentence_starts():
    text = 'He ran. "Stop!" she cried. Why?\n\nA new -- paragraph\n\nthen  more. end'
    starts = sentence_starts(text)
    pieces = [text[s:] for s in starts]
    assert [p[:6] for p in pieces] == ["He ran", '"Stop!', "she cr", "Why?\n\n", "A new ",
                                       "then  ", "end"]
    for s in starts[1:]:
        assert text[s - 1].isspace() and not text[s].isspace()


def test_shared_books_load(shared_books):
    hs = load_haystacks(shared_books)
    assert [h.index for h in hs] == list(range(len(shared_books)))
    for h in hs:
        assert len(h.text) > 100_000 and len(h.sentence_starts) > 500
        assert "\r" not in h.text and h.text == h.text.strip()
        assert "\n" in h.text and not re.search(r"[^\n]\n[^\n]", h.text)  # unwrapped


def test_bad_haystacks(tmp_path):
    with pytest.raises(DataFormatError, match="does not exist"):
        load_haystack(tmp_path / "nope.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n ", encoding="utf-8")
    with pytest.raises(DataFormatError, match="empty"):
        load_haystack(empty)
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\x00abc\xff")
    with pytest.raises(DataFormatError, match="not UTF-8"):
        load_haystack(binary)
    with pytest.raises(DataFormatError, match="no haystack files"):
        load_haystacks([])
    crlf = Haystack.from_text("One.\r\nTwo.\r\n", name="x", unwrap=False)
    assert crlf.text == "One.\nTwo." and crlf.sentence_starts == (0, 5)


def test_unwrap_hard_wrapped_lines():
    raw = "It was a dark\nand stormy night.\n\nThe next  \n  day came.\n\n\nEnd."
    h = Haystack.from_text(raw, name="x")
    assert h.text == "It was a dark and stormy night.\n\nThe next day came.\n\n\nEnd."
    assert [h.text[s:s + 3] for s in h.sentence_starts] == ["It ", "The", "End"]
    assert Haystack.from_text(raw, unwrap=False).text == raw
