"""The data a published result needs ships inside locos_tl: the books and NIAH probes
(checked against MANIFEST.json), the organisms and the elicited adapter. A missing or
damaged file is a clear error that names it and says how to reinstall."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tomllib
from pathlib import Path

import pytest

from locos_tl.data import packaged
from locos_tl.data.packaged import (
    PackagedDataError,
    book_dir,
    book_names,
    book_path,
    niah_probes_path,
    resolve_data_dir,
)
from locos_tl.errors import DataFormatError, ModelLoadError

REPO = Path(__file__).resolve().parents[1]


def test_manifest_hashes_match_the_shipped_files():
    files = packaged.manifest()
    assert sorted(files) == ["books/dracula_part1.txt", "books/mohicans_part1.txt",
                             "books/mohicans_part2.txt", "niah/niah_needles.jsonl"]
    for rel, entry in files.items():
        data = (packaged.DATA_DIR / rel).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], rel
        assert entry["source"] and entry["licence"]
    # every file in books/ and niah/ is in the manifest (nothing unlisted ships)
    on_disk = {p.relative_to(packaged.DATA_DIR).as_posix()
               for d in ("books", "niah") for p in (packaged.DATA_DIR / d).iterdir()}
    assert on_disk == set(files)


def test_named_paths():
    assert book_names() == ["dracula_part1", "mohicans_part1", "mohicans_part2"]
    assert book_path("mohicans_part2").read_text().count("\n") > 1000
    assert sorted(p.stem for p in book_dir().glob("*.txt")) == book_names()
    probes = [json.loads(line) for line in niah_probes_path().read_text().splitlines()]
    assert len(probes) == 3 and all({"needle", "question", "real_needle"} <= set(p)
                                    for p in probes)
    assert resolve_data_dir(None) == (book_dir(), niah_probes_path())


def test_unknown_book_names_the_shipped_ones():
    with pytest.raises(PackagedDataError, match=r"unknown book 'moby'.*mohicans_part1"):
        book_path("moby")


@pytest.fixture
def copied_data(tmp_path, monkeypatch):
    """A copy of locos_tl/data's manifest, books and probes the test may break."""
    root = tmp_path / "data"
    for d in ("books", "niah"):
        shutil.copytree(packaged.DATA_DIR / d, root / d)
    shutil.copy(packaged.MANIFEST, root / "MANIFEST.json")
    monkeypatch.setattr(packaged, "DATA_DIR", root)
    monkeypatch.setattr(packaged, "MANIFEST", root / "MANIFEST.json")
    monkeypatch.setattr(packaged, "BOOK_DIR", root / "books")
    packaged.manifest.cache_clear()
    packaged._verified.cache_clear()
    yield root
    packaged.manifest.cache_clear()
    packaged._verified.cache_clear()


def test_missing_file_names_it_and_how_to_reinstall(copied_data):
    (copied_data / "niah" / "niah_needles.jsonl").unlink()
    with pytest.raises(PackagedDataError, match=r"niah/niah_needles.jsonl is missing.*"
                                                r"reinstall"):
        niah_probes_path()


def test_damaged_file_is_a_hash_mismatch(copied_data):
    book = copied_data / "books" / "dracula_part1.txt"
    book.write_text(book.read_text()[:-10])
    with pytest.raises(PackagedDataError, match=r"dracula_part1.txt is damaged: SHA-256"):
        book_path("dracula_part1")
    with pytest.raises(PackagedDataError, match="damaged"):
        book_dir()  # every book verified
    assert issubclass(PackagedDataError, DataFormatError)


def test_an_unlisted_book_is_refused_by_every_reader(copied_data, tiny_dirs, tmp_path):
    """A ``*.txt`` the manifest does not list would be read as a shipped book (a quarter of
    the NoLiMa trials on four books, recorded as ``locos_tl:books``): refused by name."""
    from typer.testing import CliRunner

    from locos_tl.cli import app
    from locos_tl.organisms import default_book_dir

    extra = copied_data / "books" / "my_notes.txt"
    extra.write_text((copied_data / "books" / "dracula_part1.txt").read_text()[:20_000])
    named = r"books folder holds my_notes.txt, which MANIFEST.json does not list.*Remove it"
    for reader in (book_dir, default_book_dir, lambda: resolve_data_dir(None)):
        with pytest.raises(PackagedDataError, match=named):
            reader()
    assert book_path("dracula_part1").name == "dracula_part1.txt"  # by name: still fine
    out = tmp_path / "t.jsonl"
    res = CliRunner().invoke(app, [
        "build-trials", "nolima", "--needle-set", "everyday", "--tokenizer",
        str(tiny_dirs["qwen3"]), "--out", str(out), "--lengths", "480", "--depths", "50",
        "--num-examples", "8", "--question-type", "onehop"])
    assert res.exit_code == 2, res.output
    assert "my_notes.txt" in res.output and "--haystack" in res.output
    assert not out.exists()
    extra.unlink()
    assert book_dir() == copied_data / "books"


def test_given_data_dir_must_have_the_release_layout(tmp_path):
    with pytest.raises(DataFormatError, match=r"lacks .*haystack.*niah_needles.jsonl"):
        resolve_data_dir(tmp_path)
    (tmp_path / "haystack").mkdir()
    (tmp_path / "niah_needles.jsonl").write_text("")
    assert resolve_data_dir(tmp_path) == (tmp_path / "haystack",
                                          tmp_path / "niah_needles.jsonl")


def test_no_library_code_or_default_reads_a_folder_beside_the_repository():
    pattern = re.compile(r"\.\./shared|/ \"shared\"|\"shared\" /")
    offenders = [f"{p.relative_to(REPO)}:{i}"
                 for d in ("locos_tl", "benchmarks", "experiments", "notebooks", "scripts",
                           "tests")
                 for p in (REPO / d).rglob("*") if p.suffix in (".py", ".sh", ".ipynb")
                 and p.name != Path(__file__).name
                 for i, line in enumerate(p.read_text().splitlines(), 1)
                 if pattern.search(line)]
    assert offenders == []


def test_organisms_and_adapter_are_package_data():
    from locos_tl.models.shipped import SHIPPED_DIR, shipped_path
    from locos_tl.organisms import ORGANISMS

    assert SHIPPED_DIR.parent == packaged.DATA_DIR.parent  # inside the package
    for path in ORGANISMS.values():
        assert (Path(path) / "model.safetensors").is_file()
    assert shipped_path("smollm2-135m-nolima", "adapter", "adapter_model.safetensors")
    with pytest.raises(ModelLoadError, match=r"no-such/adapter is missing.*reinstall"):
        shipped_path("no-such", "adapter")
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["locos_tl"]
    assert {"organisms_data/**/*", "data/books/*.txt", "data/niah/*.jsonl",
            "data/MANIFEST.json"} <= set(globs)
