"""The third-party data files shipped inside locos_tl (public-domain book text and the
NIAH probes of Wu et al. 2025), found by name and checked against ``MANIFEST.json``.

Every command, benchmark and notebook reads these copies by default, so a clone or an
installed wheel rebuilds the published trials with nothing beside it. Provenance and
licences: ``locos_tl/data/DATA.md``.

Example:
    >>> from locos_tl.data.packaged import book_path, niah_probes_path
    >>> book_path("mohicans_part1").name
    'mohicans_part1.txt'
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from locos_tl.errors import DataFormatError

#: locos_tl/data (the packaged data's root)
DATA_DIR = Path(__file__).resolve().parent
#: the manifest: relative path -> sha256, what, source, licence
MANIFEST = DATA_DIR / "MANIFEST.json"
#: the shipped books (``<name>.txt``)
BOOK_DIR = DATA_DIR / "books"
#: the evaluation books of the paper's protocol (NoLiMa trials on real models)
EVAL_BOOKS = ("mohicans_part1", "mohicans_part2")
#: the training book of ``locos elicit``
TRAIN_BOOK = "dracula_part1"

_REINSTALL = ("reinstall locos_tl (pip install --force-reinstall locos_tl) or, in a "
              "clone, restore it (git checkout -- locos_tl/data)")


class PackagedDataError(DataFormatError):
    """A packaged data file is missing or does not match its SHA-256 in the manifest."""


@functools.cache
def manifest() -> dict[str, dict[str, str]]:
    """The manifest's ``files`` table: relative path -> {sha256, what, source, licence}.

    Raises:
        PackagedDataError: ``MANIFEST.json`` is missing.
    """
    if not MANIFEST.is_file():
        raise PackagedDataError(f"the data manifest {MANIFEST} is missing; {_REINSTALL}")
    return json.loads(MANIFEST.read_text())["files"]


@functools.cache
def _verified(rel: str) -> Path:
    entry = manifest().get(rel)
    if entry is None:
        raise PackagedDataError(f"{rel!r} is not a packaged data file; packaged: "
                                f"{sorted(manifest())}")
    path = DATA_DIR / rel
    if not path.is_file():
        raise PackagedDataError(f"packaged data file {rel} is missing ({path}); {_REINSTALL}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != entry["sha256"]:
        raise PackagedDataError(
            f"packaged data file {rel} is damaged: SHA-256 {digest[:16]}... differs from the "
            f"manifest's {entry['sha256'][:16]}... ({path}); {_REINSTALL}")
    return path


def packaged_file(rel: str) -> Path:
    """The path of a packaged data file, after checking its SHA-256 (once a process).

    Args:
        rel: the path relative to ``locos_tl/data``, e.g. ``"books/dracula_part1.txt"``.

    Raises:
        PackagedDataError: unknown name, missing file, or a hash mismatch (damaged).
    """
    return _verified(rel)


def book_names() -> list[str]:
    """The shipped books' names (``mohicans_part1``, ...), sorted."""
    return sorted(Path(rel).stem for rel in manifest() if rel.startswith("books/"))


def book_path(name: str) -> Path:
    """One shipped book (``"mohicans_part1"``, ``"mohicans_part2"``, ``"dracula_part1"``).

    Raises:
        PackagedDataError: unknown book (the message lists them), missing or damaged file.
    """
    if name not in book_names():
        raise PackagedDataError(f"unknown book {name!r}; shipped: {book_names()}")
    return packaged_file(f"books/{name}.txt")


def book_dir() -> Path:
    """The folder of the shipped books: every ``*.txt`` in it is listed in the manifest
    and matches its SHA-256, so a reader may take all of them.

    Raises:
        PackagedDataError: a book is missing or damaged, or the folder holds a ``*.txt``
            the manifest does not list (named, with how to use text of one's own).
    """
    listed = {f"{name}.txt" for name in book_names()}
    unlisted = sorted(p.name for p in BOOK_DIR.glob("*.txt") if p.name not in listed)
    if unlisted:
        raise PackagedDataError(
            f"the packaged books folder holds {', '.join(unlisted)}, which {MANIFEST.name} "
            f"does not list ({BOOK_DIR}); every reader of that folder would take it for a "
            "shipped book. Remove it; for text of your own, keep it in a folder of your own "
            "and pass that (locos build-trials nolima/niah --haystack, locos demo --book, "
            "the protocol's --data-dir)")
    for name in book_names():
        book_path(name)
    return BOOK_DIR


def niah_probes_path() -> Path:
    """The NIAH probe file of Wu et al. (2025) (JSON lines: needle, question,
    real_needle), for :func:`locos_tl.data.niah.load_niah_probes`.

    Raises:
        PackagedDataError: missing or damaged file.
    """
    return packaged_file("niah/niah_needles.jsonl")


def resolve_data_dir(data_dir: str | Path | None) -> tuple[Path, Path]:
    """The books folder and NIAH probe file of a ``--data-dir`` option.

    Args:
        data_dir: ``None`` for the packaged copies, else a folder holding
            ``haystack/*.txt`` and ``niah_needles.jsonl`` (the layout of the original
            data release).

    Returns:
        ``(book folder, NIAH probe file)``.

    Raises:
        PackagedDataError: packaged data missing or damaged, or a ``*.txt`` in the packaged
            books folder that the manifest does not list (:func:`book_dir`).
        DataFormatError: a given folder lacks ``haystack/`` or ``niah_needles.jsonl``.
    """
    if data_dir is None:
        return book_dir(), niah_probes_path()
    root = Path(data_dir)
    books, probes = root / "haystack", root / "niah_needles.jsonl"
    missing = [str(p) for p in (books, probes) if not p.exists()]
    if missing:
        raise DataFormatError(f"--data-dir {root} lacks {', '.join(missing)}; leave it out "
                              "to use the copies shipped with locos_tl")
    return books, probes
