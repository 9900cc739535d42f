"""Hub loaders: fail fast offline with a useful message; read local copies."""

from __future__ import annotations

import json
import socket

import pandas as pd
import pytest

from locos_tl.data import hub
from locos_tl.data.hub import (
    HubUnavailableError,
    fetch_nolima,
    load_babilong,
    load_musique,
    load_nolima,
    load_parametric_controls,
    load_tokenizer,
)
from locos_tl.errors import DataFormatError

LOADERS = {
    "nolima": (lambda c: fetch_nolima(cache_dir=c), "amodaresi/NoLiMa"),
    "musique": (lambda c: load_musique(cache_dir=c), "dgslibisey/MuSiQue"),
    "babilong": (lambda c: load_babilong("qa3", "2k", cache_dir=c), "RMT-team/babilong"),
    "parametric": (lambda c: load_parametric_controls(cache_dir=c),
                   "aryopg/parametric-arithmetic-eval"),
}


@pytest.mark.parametrize("name", list(LOADERS))
def test_offline_fails_fast_with_instructions(monkeypatch, tmp_path, name):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    call, repo = LOADERS[name]

    def no_network(*a, **k):  # offline means no connection is even tried
        raise AssertionError("a network connection was attempted offline")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    with pytest.raises(HubUnavailableError) as exc:
        call(tmp_path / "cache")
    msg = str(exc.value)
    assert "HF_HUB_OFFLINE=1" in msg and f"hf download --repo-type dataset {repo}" in msg
    assert "pass its path" in msg


@pytest.fixture
def silent_hub(monkeypatch):
    """A hub endpoint that accepts the connection and never answers (a hung network)."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    conns = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{srv.getsockname()[1]}")
    monkeypatch.setattr(hub, "PROBE_TIMEOUT_S", 0.5)
    probes = []
    real = hub.hub_problem

    def recorded(*a, **k):
        probes.append(k.get("timeout"))
        return real(*a, **k)

    monkeypatch.setattr(hub, "hub_problem", recorded)
    yield probes
    stop.set()
    t.join(2)
    for c in conns:
        c.close()
    srv.close()


@pytest.mark.parametrize("name", list(LOADERS))
def test_hung_network_fails_fast(silent_hub, tmp_path, name):
    """A silent hub is given up on by the bounded probe (one probe, the patched
    0.5 s timeout), not by the HTTP client's own minutes-long timeouts."""
    with pytest.raises(HubUnavailableError, match="not reachable: no answer from http://127"):
        LOADERS[name][0](tmp_path / "cache")
    assert silent_hub and all(t is None for t in silent_hub)  # PROBE_TIMEOUT_S


def test_refused_and_not_found_are_unreachable(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(hub, "PROBE_TIMEOUT_S", 0.5)
    assert hub.hub_problem("a/b").startswith("no answer from http://127.0.0.1:9/api/datasets/a/b")


def test_tokenizer_offline_message(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubUnavailableError, match="hf download some-org/not-cached-model"):
        load_tokenizer("some-org/not-cached-model")


def test_tokenizer_hung_network_fails_fast(silent_hub):
    with pytest.raises(HubUnavailableError, match="hf download some-org/not-cached --include"):
        load_tokenizer("some-org/not-cached")
    assert silent_hub and all(t is None for t in silent_hub)  # PROBE_TIMEOUT_S


def test_tokenizer_from_local_dir(tmp_path):
    from trialdata_helpers import get_tokenizer

    tok = get_tokenizer("metaspace")
    tok.save_pretrained(tmp_path / "tok")
    loaded = load_tokenizer(tmp_path / "tok")
    text = "Actually, Zoë lives next to the Harbour Bridge."
    assert loaded(text)["input_ids"] == tok(text)["input_ids"]
    assert loaded.chat_template == tok.chat_template
    with pytest.raises(DataFormatError, match="no usable tokenizer"):
        load_tokenizer(tmp_path)


def test_nolima_local_layout(tmp_path):
    from trialdata_helpers import needle_set_entries

    (tmp_path / "needlesets").mkdir()
    (tmp_path / "needlesets" / "needle_set.json").write_text(json.dumps(needle_set_entries()))
    (tmp_path / "needlesets" / "needle_set_w_Distractor.json").write_text(
        json.dumps(needle_set_entries(True)))
    books = tmp_path / "haystack" / "rand_shuffle"
    books.mkdir(parents=True)
    for i in (1, 10, 2):
        (books / f"rand_book_{i}.txt").write_text(f"Book {i} begins. It has two sentences.")
    files = fetch_nolima(tmp_path)
    assert [p.name for p in files.haystacks] == ["rand_book_1.txt", "rand_book_2.txt",
                                                 "rand_book_10.txt"]
    entries, hays = load_nolima(tmp_path, needle_set="needle_set_w_Distractor.json")
    assert entries[0].distractors["onehop"].startswith("There was an article")
    assert [(h.index, h.text[:6]) for h in hays] == [(0, "Book 1"), (1, "Book 2"),
                                                    (2, "Book 1")]
    with pytest.raises(DataFormatError, match="no needle_set_MC.json"):
        fetch_nolima(tmp_path, needle_set="needle_set_MC.json")


def test_musique_local(tmp_path):
    para = [{"idx": 0, "title": "Wellington", "paragraph_text": "Wellington is windy.",
             "is_supporting": True},
            {"idx": 1, "title": "Oslo", "paragraph_text": "Oslo has fjords.",
             "is_supporting": False}]
    recs = [
        {"id": "2hop_1", "paragraphs": para, "question": "Which windy city?",
         "answer": "Wellington", "answer_aliases": ["Te Whanganui-a-Tara"], "answerable": True},
        {"id": "2hop_2", "paragraphs": para, "question": "Unanswerable?", "answer": "",
         "answer_aliases": [], "answerable": False},
        {"id": "2hop_3", "paragraphs": para[:1], "question": "Fjords?", "answer": "Oslo",
         "answerable": True},
    ]
    f = tmp_path / "musique_ans_v1.0_dev.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in recs))
    got = load_musique(tmp_path)
    assert [g.id for g in got] == ["2hop_1", "2hop_3"]
    assert got[0].paragraphs[0] == ("Wellington", "Wellington is windy.", True)
    assert got[0].answer_aliases == ("Te Whanganui-a-Tara",)
    assert len(load_musique(f, limit=1)) == 1
    f.write_text(json.dumps({"id": "x", "paragraphs": []}))
    with pytest.raises(DataFormatError, match="record 1: missing field 'question'"):
        load_musique(f)


def test_babilong_local(tmp_path):
    rows = [{"input": "Mary went to the garden. Mary took the apple.",
             "question": "Where is the apple?", "target": "garden"},
            {"input": "John moved to the office.", "question": "Where is John?",
             "target": "office"}]
    f = tmp_path / "qa2.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows))
    got = load_babilong("qa2", "1k", f)
    assert [(g.target, g.task, g.length) for g in got] == [("garden", "qa2", "1k"),
                                                           ("office", "qa2", "1k")]
    pq = tmp_path / "qa3.parquet"
    pd.DataFrame(rows).to_parquet(pq)
    assert [g.question for g in load_babilong("qa3", "1k", pq, limit=1)] == ["Where is the apple?"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"input": "x", "question": "y"}]))
    with pytest.raises(DataFormatError, match="missing field 'target'"):
        load_babilong("qa2", "1k", bad)


def test_parametric_controls_local(tmp_path):
    rows = [{"question": "What country is Lyon in?", "answer": "France",
             "category": "parametric", "id": 1},
            {"prompt": "3 + 4 =", "target": "7", "type": "arithmetic", "id": 2}]
    f = tmp_path / "controls.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows))
    got = load_parametric_controls(f)
    assert [(g.question, g.answer, g.category) for g in got] == [
        ("What country is Lyon in?", "France", "parametric"), ("3 + 4 =", "7", "arithmetic")]
    assert got[0].meta == {"id": 1}
    f.write_text(json.dumps({"text": "no question", "label_x": 1}))
    with pytest.raises(DataFormatError, match=r"columns: \['label_x', 'text'\]"):
        load_parametric_controls(f)


def test_missing_local_tokenizer_dir_is_not_a_hub_name(tmp_path):
    from locos_tl.data.hub import load_tokenizer
    from locos_tl.errors import DataFormatError

    with pytest.raises(DataFormatError, match="tokenizer directory .* does not exist"):
        load_tokenizer(tmp_path / "nope")
