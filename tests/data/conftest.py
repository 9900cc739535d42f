"""Fixtures for the data-layer tests (tokenizers trained on the shipped books, needle
sets and probe files written by the tests; see ``trialdata_helpers``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trialdata_helpers import BOOKS, get_tokenizer, needle_set_entries  # noqa: E402


@pytest.fixture(scope="session")
def shared_books() -> list[Path]:
    assert len(BOOKS) == 3, BOOKS  # the three books shipped with locos_tl
    return BOOKS


@pytest.fixture(scope="session", params=["bytelevel", "metaspace"])
def tokenizer(request):
    return get_tokenizer(request.param)


@pytest.fixture(scope="session")
def haystacks(shared_books):
    from locos_tl.data import load_haystacks

    return load_haystacks(shared_books)


@pytest.fixture
def needle_set_file(tmp_path) -> Path:
    path = tmp_path / "needle_set.json"
    path.write_text(json.dumps(needle_set_entries(), indent=1), encoding="utf-8")
    return path


@pytest.fixture
def distractor_set_file(tmp_path) -> Path:
    path = tmp_path / "needle_set_w_Distractor.json"
    path.write_text(json.dumps(needle_set_entries(True), indent=1), encoding="utf-8")
    return path


@pytest.fixture
def niah_file(tmp_path) -> Path:
    """Invented probes in the published NIAH JSON-lines format."""
    probes = [
        {"needle": "The secret ingredient of the harbour chowder is smoked paprika from Vera.",
         "question": "What is the secret ingredient of the harbour chowder?",
         "real_needle": "smoked paprika from Vera"},
        {"question": "Where did the lighthouse keeper hide the key?",
         "needle": "The lighthouse keeper hid the key under the third blue stone by the gate.",
         "real_needle": "Under the third blue stone by the gate."},
    ]
    path = tmp_path / "probes.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in probes) + "\n", encoding="utf-8")
    return path
