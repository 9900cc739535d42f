"""Temporary folders of the shared cache and their liveness.

A preparation writes its entry into a temporary folder beside it and holds a lock on
that folder for its whole life (``<root>/locks/``), so a temporary folder is removed as
abandoned only when its lock is free: safe when several hosts or containers share the
cache, where process ids say nothing. A finished folder is shared by the umask
(:mod:`locos_tl.models.cache_access`) and moved into place. Used by
:mod:`locos_tl.models.gguf_cache` (which re-exports these names) and
:mod:`locos_tl.models.elicited`.

Only the standard library is imported at module level (``filelock`` when a lock is
taken).
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from locos_tl.models.cache_access import cache_root, current_umask, permission_error, share_by_umask


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tmp_lock_path(tmp: Path) -> Path:
    """The lock a preparation holds on its temporary folder ``tmp`` for its whole life:
    ``<cache root>/locks/<kind>-<tmp name>.lock``."""
    return tmp.parent.parent / "locks" / f"{tmp.parent.name}-{tmp.name}.lock"


def _lock(path: Path, timeout: float = -1.0) -> Any:
    from filelock import FileLock

    return FileLock(str(path), timeout=timeout, mode=0o666 & ~current_umask())


@contextmanager
def temporary_folder(out: Path) -> Iterator[Path]:
    """A new temporary folder path for the entry ``out`` (``<name>.tmp-<pid>-<random>``,
    beside it; not created), whose lock (:func:`_tmp_lock_path`) this process holds
    until the block ends, so no other process, on this host or another one sharing the
    cache, takes it for abandoned. The folder is removed when the block raises or leaves
    it behind (:func:`install_entry` moves it into place).

    Raises:
        CachePermissionError: the cache's lock folder is not writable by this user.
    """
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    lock_path = _tmp_lock_path(tmp)
    lock = _lock(lock_path)
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except PermissionError as exc:
        raise permission_error(Path(exc.filename or lock_path), write=True) from None
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # an error, or never installed
        lock.release()
        lock_path.unlink(missing_ok=True)


def _abandoned(tmp: Path) -> bool:
    """Remove ``tmp`` when no preparation holds its lock (killed: the lock went with
    its process, on whichever host); True when removed. A lock this user cannot open
    (another user's preparation) leaves the folder alone."""
    from filelock import Timeout

    lock_path = _tmp_lock_path(tmp)
    lock = _lock(lock_path, timeout=0.0)
    try:
        lock.acquire()
    except (Timeout, OSError):  # held (a live preparation), or not ours to judge
        return False
    try:
        shutil.rmtree(tmp, ignore_errors=True)
    finally:
        lock.release()
        lock_path.unlink(missing_ok=True)
    return True


def remove_stale_temporaries(digest: str | None = None,
                             root: Path | None = None) -> list[Path]:
    """Remove the temporary folders of killed preparations in ``root`` (default: the
    GGUF entries' folder): every one of the entry ``digest`` (whose entry lock the
    caller holds), and any other whose lock is free (:func:`temporary_folder`; a lock
    lives in the file system, so this holds across hosts and containers sharing the
    cache). A folder named by an older locos_tl (``<name>.tmp-<pid>``, no lock) is
    judged by its process id, as that version did.

    Returns:
        The folders removed.
    """
    root = root or cache_root() / "gguf"
    removed = []
    for tmp in sorted(root.glob("*.tmp-*")) if root.is_dir() else ():
        if not tmp.is_dir():
            continue
        name, _, tag = tmp.name.partition(".tmp-")
        if name == digest:
            shutil.rmtree(tmp, ignore_errors=True)
            _tmp_lock_path(tmp).unlink(missing_ok=True)
        elif tag.isdigit():  # an older version's folder: its pid is all there is
            if _pid_alive(int(tag)):
                continue
            shutil.rmtree(tmp, ignore_errors=True)
        elif not _abandoned(tmp):
            continue
        removed.append(tmp)
    return removed



def install_entry(tmp: Path, out: Path) -> None:
    """Share a finished temporary folder by the umask (:func:`share_by_umask`) and move
    it into place (a damaged ``out`` is replaced): a directory under an entry's name is
    always complete."""
    share_by_umask(tmp)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)

