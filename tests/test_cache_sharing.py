"""One model cache, several users and hosts: entries are readable as the umask allows, a
file another user's entry does not let this one read is a permission problem (named, with
its owner and the fix), never damage to repair, and a preparation on another host sharing
the cache keeps its temporary folder."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from locos_tl.errors import CachePermissionError

pytest.importorskip("gguf", reason="the gguf extra is not installed")
REPO = Path(__file__).resolve().parents[1]


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


@pytest.fixture
def entry(tiny_zoo, cache):
    """The tiny GGUF file registered as the zoo model ``tiny-test``, prepared."""
    from locos_tl.models import zoo

    zoo.fetch("tiny-test", log=lambda msg: None)
    return tiny_zoo


def _modes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): stat.S_IMODE(p.stat().st_mode)
            for p in [folder, *folder.rglob("*")]}


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_a_prepared_entry_is_readable_as_the_umask_allows(tiny_gguf, cache, mask):
    """safetensors writes its weights 0600; the entry's files end up 0666 & ~umask, its
    folders 0777 & ~umask, like any file the user creates."""
    from locos_tl.models.gguf_cache import prepare_gguf

    old = os.umask(mask)
    try:
        d = prepare_gguf(tiny_gguf)
    finally:
        os.umask(old)
    modes = _modes(d)
    assert "model.safetensors" in modes and "gguf_source.json" in modes
    assert modes == {name: (0o777 if (d / name).is_dir() else 0o666) & ~mask
                     for name in modes}


def test_a_merged_elicited_entry_is_readable_as_the_umask_allows(tiny_dirs, tmp_path,
                                                                 monkeypatch):
    """Also the tokenizer files copied from a base entry an older version wrote 0600."""
    pytest.importorskip("peft", reason="the elicit extra is not installed")
    import torch

    from locos_tl.models import elicited, shipped
    from locos_tl.organisms import elicit as el

    base = tmp_path / "base"
    shutil.copytree(tiny_dirs["llama"], base)
    for p in base.iterdir():
        p.chmod(0o600)
    from transformers import AutoModelForCausalLM

    wrapped = el.add_mlp_lora(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                              el.ElicitConfig(rank=2, alpha=4))
    monkeypatch.setattr(elicited, "SHIPPED", tmp_path / "shipped")
    monkeypatch.setattr(shipped, "SHIPPED_DIR", tmp_path / "shipped")
    monkeypatch.setenv("LOCOS_CACHE", str(tmp_path / "cache"))
    entry = elicited.ElicitedModel(name="tiny-nolima", base="tiny", architecture="Llama",
                                   n_layers=2, n_heads=4, n_kv_heads=2, params="1M",
                                   licence="MIT")
    wrapped.save_pretrained(entry.adapter)
    old = os.umask(0o022)
    try:
        out = elicited.merge(entry, base)
    finally:
        os.umask(old)
    modes = _modes(out)
    assert {"model.safetensors", "tokenizer.json", "gguf_source.json"} <= modes.keys()
    assert modes == {n: 0o755 if (out / n).is_dir() else 0o644 for n in modes}
    record = json.loads((out / "gguf_source.json").read_text())
    assert record["adapter_sha256"] == entry.adapter_sha256()


def test_an_unreadable_weights_file_is_a_permission_problem_not_damage(entry, tiny_gguf,
                                                                      monkeypatch):
    """Another user's entry written 0600 (by an older version): every check says whose
    file it is and how to share it, and nothing tries to repair it."""
    import locos_tl.models.gguf_cache as gc
    from locos_tl import load_model
    from locos_tl.models import zoo

    weights = entry.directory / "model.safetensors"
    real_open = Path.open

    def deny(self, *a, **k):  # what a 0600 file of another user does to this one
        if self == weights:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *a, **k)

    monkeypatch.setattr(Path, "open", deny)
    monkeypatch.setattr(gc, "_convert", lambda *a: pytest.fail("repaired a healthy entry"))
    status = entry.status()
    assert status.startswith(f"not readable: {weights} is not readable by {_me()}: it "
                             f"belongs to {_me()} (mode 0644")
    assert f"`chmod -R a+rX {entry.directory}`" in status and "LOCOS_CACHE" in status
    assert "not damaged" in status and "unreadable safetensors header" not in status
    row = next(r for r in zoo.models_table() if r["name"] == "tiny-test")
    assert row["installed"].startswith("not readable")
    with pytest.raises(CachePermissionError, match="not damaged; ask"):
        load_model("tiny-test", device="cpu")
    with pytest.raises(CachePermissionError, match=str(weights)):
        zoo.fetch("tiny-test", log=lambda msg: None)  # `locos models fetch`: no repair
    with pytest.raises(CachePermissionError, match=str(weights)):
        gc.prepare_gguf(tiny_gguf, repair=True)


def test_a_lock_file_of_another_user_is_named_not_raised_raw(entry, tiny_gguf, cache,
                                                             monkeypatch):
    """A damaged entry needs the lock to be repaired; another user's lock file (not
    writable here) is reported with its owner and the fix."""
    import filelock

    import locos_tl.models.gguf_cache as gc

    weights = entry.directory / "model.safetensors"
    with weights.open("r+b") as f:
        f.truncate(100)

    def deny(self, *a, **k):
        raise PermissionError(13, "Permission denied", str(self.lock_file))

    monkeypatch.setattr(filelock.FileLock, "acquire", deny)
    monkeypatch.setattr(gc, "_convert", lambda *a: pytest.fail("prepared without the lock"))
    lock = cache / "locks" / f"gguf-{entry.sha256}.lock"
    with pytest.raises(CachePermissionError,
                       match=f"cannot take the lock {lock}: it belongs to {_me()} "
                             r"\(mode 0[0-7]{3}, not writable by .*LOCOS_CACHE"):
        gc.prepare_gguf(tiny_gguf, repair=True)


def _as_user(uid: int, fn):
    """``fn()`` in a forked child running as ``uid`` (modules it needs are imported
    already); its result or error as JSON."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            os.setgid(uid)
            os.setuid(uid)
            try:
                out = {"result": fn()}
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                out = {"error": type(exc).__name__, "message": str(exc)}
            os.write(w, json.dumps(out, default=str).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.mark.skipif(not hasattr(os, "fork") or os.geteuid() != 0,
                    reason="needs root to act as another user")
def test_another_user_reads_a_shared_entry(tiny_gguf, monkeypatch):
    """The real thing: a cache prepared by root, used by ``nobody`` (uid 65534)."""
    import pwd  # noqa: F401 - the child looks owners up

    import locos_tl.models.gguf_cache as gc

    nobody = 65534
    shared = Path(tempfile.mkdtemp(prefix="locos-shared-"))  # /tmp: every user gets in
    try:
        shared.chmod(0o755)
        src = shared / "tiny.gguf"
        shutil.copyfile(tiny_gguf, src)
        src.chmod(0o644)
        monkeypatch.setenv("LOCOS_CACHE", str(shared / "cache"))
        old = os.umask(0o022)
        try:
            d = gc.prepare_gguf(src)
        finally:
            os.umask(old)
        sha = d.name
        gc.permission_error(d / "x")  # imported before the fork: the child cannot import

        fresh = _as_user(nobody, lambda: [gc.entry_problems(d),
                                          str(gc.prepare_gguf(src, sha256=sha))])
        assert fresh == {"result": [[], str(d)]}  # healthy, loaded without any lock

        weights = d / "model.safetensors"
        weights.chmod(0o600)  # an entry an older version wrote
        old_entry = _as_user(nobody, lambda: gc.entry_problems(d))
        assert old_entry["error"] == "CachePermissionError"
        assert old_entry["message"].startswith(
            f"{weights} is not readable by nobody: it belongs to root (mode 0600")
        assert f"`chmod -R a+rX {d}`" in old_entry["message"]
        again = _as_user(nobody, lambda: str(gc.prepare_gguf(src, sha256=sha, repair=True)))
        assert again["error"] == "CachePermissionError"
        assert stat.S_IMODE(weights.stat().st_mode) == 0o600  # untouched
        gc.grant_read(d)  # `locos models fetch` by its owner shares it
        assert _as_user(nobody, lambda: gc.entry_problems(d)) == {"result": []}

        with weights.open("r+b") as f:  # damaged: repairing needs root's lock
            f.truncate(100)
        locked = _as_user(nobody, lambda: str(gc.prepare_gguf(src, sha256=sha, repair=True)))
        assert locked["error"] == "CachePermissionError"
        assert locked["message"].startswith(
            f"cannot take the lock {shared / 'cache' / 'locks' / f'gguf-{sha}.lock'}: it "
            "belongs to root (mode 0644, not writable by nobody)")
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_preparation_on_another_host_keeps_its_temporary_folder(tiny_gguf, cache,
                                                                  tmp_path):
    """A preparation in another container or host sharing the cache has a process id
    that means nothing here (here: the id of a process that is gone). Its temporary
    folder stays while it runs (its lock is held), and goes once it was killed."""
    import locos_tl.models.gguf_cache as gc

    other = tmp_path / "other.gguf"  # another file: another entry
    data = bytearray(tiny_gguf.read_bytes())
    data[-1] ^= 1
    other.write_bytes(bytes(data))
    dead = _dead_pid()
    code = (
        "import os, sys\n"
        "import locos_tl.models.gguf_cache as gc\n"
        "def convert(src, dest, plan):\n"
        "    dest.mkdir(parents=True)\n"
        "    (dest / 'model.safetensors').write_bytes(b'x' * 100)\n"
        "    print('converting', flush=True)\n"
        "    sys.stdin.read()\n"
        "gc._convert = convert\n"
        f"os.getpid = lambda: {dead}  # another host's process id\n"
        f"gc.prepare_gguf({str(other)!r})\n"
    )
    env = {**os.environ, "LOCOS_CACHE": str(cache), "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "converting"
        (foreign,) = (cache / "gguf").glob("*.tmp-*")
        assert foreign.name.partition(".tmp-")[2].split("-")[0] == str(dead)
        sha = hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
        assert gc.prepare_gguf(tiny_gguf) == gc.cached_dir(sha)  # cleans up beside it
        assert foreign.is_dir() and (foreign / "model.safetensors").is_file()
        assert gc.remove_stale_temporaries() == []
    finally:
        proc.kill()
        proc.wait()
    assert gc.remove_stale_temporaries() == [foreign] and not foreign.exists()
    assert not [p for p in (cache / "locks").iterdir() if foreign.name in p.name]
