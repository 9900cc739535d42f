"""The prepared-checkpoint cache knows its own health: damaged entries are reported and
repaired, killed preparations leave nothing behind, concurrent preparations are safe."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from locos_tl import ModelLoadError, load_model

pytest.importorskip("gguf", reason="the gguf extra is not installed")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def entry(tiny_zoo, cache):
    """The tiny GGUF file registered as the zoo model ``tiny-test``, prepared."""
    from locos_tl.models import zoo

    zoo.fetch("tiny-test", log=lambda msg: None)
    return tiny_zoo


def test_preparation_records_each_file_size_and_hash(entry):
    record = json.loads((entry.directory / "gguf_source.json").read_text())
    files = record["files"]
    on_disk = {p.name for p in entry.directory.iterdir()} - {"gguf_source.json"}
    assert set(files) == on_disk and "model.safetensors" in files
    for name, info in files.items():
        path = entry.directory / name
        assert info["size"] == path.stat().st_size
        assert info["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert entry.status() == "yes" and entry.problems(verify=True) == []


def _cut(path: Path, size: int) -> None:
    with path.open("r+b") as f:
        f.truncate(size)


def test_a_cut_weights_file_is_damaged_refused_and_repaired(entry):
    from locos_tl.models import zoo

    weights = entry.directory / "model.safetensors"
    full = weights.stat().st_size
    _cut(weights, 2000)
    assert entry.status().startswith("damaged: model.safetensors: 0.0 MB, expected")
    row = next(r for r in zoo.models_table() if r["name"] == "tiny-test")
    assert row["installed"].startswith("damaged")
    with pytest.raises(ModelLoadError, match=r"damaged \(model.safetensors: .*\); repair it "
                                             r"with `locos models fetch tiny-test`"):
        load_model("tiny-test", device="cpu")
    logs = []
    zoo.fetch("tiny-test", log=logs.append)
    assert any("repairing" in m for m in logs)
    assert weights.stat().st_size == full and entry.status() == "yes"
    assert load_model("tiny-test", device="cpu").cfg.n_layers == 2


def test_verify_hashes_what_sizes_cannot_see(entry):
    weights = entry.directory / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, one byte altered
    weights.write_bytes(bytes(data))
    assert entry.status() == "yes"  # sizes only: cheap, blind to this
    assert entry.status(verify=True) == ("damaged: model.safetensors: SHA-256 differs from "
                                         "the one recorded when prepared")


def test_entries_without_a_size_record_are_checked_against_their_header(entry):
    """Entries prepared before sizes were recorded: the safetensors header says how
    long the file must be."""
    record_path = entry.directory / "gguf_source.json"
    record = json.loads(record_path.read_text())
    del record["files"]
    record_path.write_text(json.dumps(record))
    assert entry.status() == "yes"
    _cut(entry.directory / "model.safetensors", 5000)
    assert "its header says" in entry.status()


def test_a_damaged_gguf_entry_names_the_repair_command(tiny_gguf, cache):
    from locos_tl.models.gguf_cache import prepare_gguf

    d = prepare_gguf(tiny_gguf)
    _cut(d / "model.safetensors", 100)
    with pytest.raises(ModelLoadError, match=f"repair it with `locos models fetch {tiny_gguf}`"):
        load_model(tiny_gguf, device="cpu")
    assert prepare_gguf(tiny_gguf, repair=True) == d
    assert load_model(tiny_gguf, device="cpu").cfg.n_layers == 2


def test_cli_list_verify_and_fetch_a_file(entry, monkeypatch):
    from typer.testing import CliRunner

    from locos_tl.cli import app

    runner = CliRunner()
    weights = entry.directory / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    out = runner.invoke(app, ["models", "list"]).output
    assert "tiny-test" in out and "damaged" not in out
    out = runner.invoke(app, ["models", "list", "--verify"]).output
    assert "damaged: model.safetensors: SHA-256 differs" in out
    res = runner.invoke(app, ["models", "fetch", "tiny-test"])
    assert res.exit_code == 0, res.output
    assert entry.status(verify=True) == "yes"


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_temporaries_of_killed_preparations_are_removed(tiny_gguf, cache):
    """A preparation killed mid-write leaves ``<sha>.tmp-<pid>``; the next one removes
    it (and any other whose process is gone), and it is never taken for an entry."""
    from locos_tl.models.gguf_cache import cached_dir, is_prepared, prepare_gguf

    sha = hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    root = cache / "gguf"
    killed = root / f"{sha}.tmp-{_dead_pid()}"
    other = root / f"{'0' * 64}.tmp-{_dead_pid()}"
    alive = root / f"{'1' * 64}.tmp-{os.getpid()}"  # a live preparation of another file
    for d in (killed, other, alive):
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"x" * 1000)
        (d / "config.json").write_text("{}")
        (d / "gguf_source.json").write_text("{}")
    assert not is_prepared(cached_dir(sha))
    assert prepare_gguf(tiny_gguf) == cached_dir(sha)
    assert not killed.exists() and not other.exists() and alive.exists()


def test_killed_preparation_then_next_one(tiny_gguf, cache):
    """A real SIGKILL in the middle of writing the weights."""
    code = (
        "import os, signal, sys\n"
        "import locos_tl.models.gguf_cache as gc\n"
        "real = gc.manifest\n"
        "def die(d):\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "gc.manifest = die\n"
        f"gc.prepare_gguf({str(tiny_gguf)!r})\n"
    )
    env = {**os.environ, "LOCOS_CACHE": str(cache), "PYTHONPATH": str(REPO)}
    rc = subprocess.run([sys.executable, "-c", code], env=env).returncode
    assert rc == -9
    left = list((cache / "gguf").glob("*.tmp-*"))
    assert len(left) == 1 and (left[0] / "model.safetensors").is_file()
    from locos_tl.models.gguf_cache import entry_problems, prepare_gguf

    d = prepare_gguf(tiny_gguf)
    assert not list((cache / "gguf").glob("*.tmp-*")) and entry_problems(d) == []


def test_concurrent_preparations_end_on_one_healthy_entry(tiny_gguf, cache):
    """Two processes prepare the same file at once; both load the same healthy entry."""
    code = (
        "import sys, locos_tl.models.gguf_cache as gc\n"
        f"d = gc.prepare_gguf({str(tiny_gguf)!r})\n"
        "import locos_tl\n"
        "m = locos_tl.load_model(d, device='cpu')\n"
        "print(d, m.cfg.n_layers)\n"
    )
    env = {**os.environ, "LOCOS_CACHE": str(cache), "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    from locos_tl.models.gguf_cache import entry_problems

    sha = hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    d = cache / "gguf" / sha
    assert outs == [f"{d} 2", f"{d} 2"]
    assert entry_problems(d, verify=True) == []
    assert [p.name for p in (cache / "gguf").iterdir()] == [sha]
