"""Who may read the shared cache: its root, file modes by the umask, and the error for a
file another user's entry does not let this one read.

One cache may serve several users (a shared disk, a container built as one user and run
as another): an entry's files and folders are made readable as the preparing user's
umask allows (``0o666 & ~umask``, folders ``0o777 & ~umask``; safetensors itself writes
its weights file ``0o600``), and a file another user's entry does not let this one read
is reported as such (:class:`~locos_tl.errors.CachePermissionError`, naming the file,
its owner and the fix), never as damage to repair. Used by
:mod:`locos_tl.models.gguf_cache` (which re-exports these names) and
:mod:`locos_tl.models.cache_temp`.

Only the standard library is imported at module level.
"""

from __future__ import annotations

import os
from pathlib import Path

from locos_tl.errors import CachePermissionError


def cache_root() -> Path:
    """The cache root: ``$LOCOS_CACHE`` if set, else ``~/.cache/locos_tl``."""
    env = os.environ.get("LOCOS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "locos_tl"



def current_umask() -> int:
    """The process's umask (read from ``/proc/self/status`` where it can be, so the
    process-wide setting is never changed, even for an instant)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def share_by_umask(folder: Path) -> None:
    """Give ``folder`` and everything in it the modes a file created now would get:
    files ``0o666 & ~umask``, folders ``0o777 & ~umask`` (safetensors writes its
    weights ``0o600`` whatever the umask; a copied file keeps its source's mode)."""
    mask = current_umask()
    os.chmod(folder, 0o777 & ~mask)
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o777 & ~mask)
        for name in files:
            os.chmod(os.path.join(root, name), 0o666 & ~mask)


def grant_read(folder: Path) -> Path:
    """Add the read bits (and folders' search bits) the umask allows to the files and
    folders of ``folder`` that this user owns, leaving other bits as they are: an entry
    prepared by an older locos_tl (weights ``0o600``) becomes readable by the other
    users of a shared cache. Files of other users are left alone.

    Returns:
        ``folder``.
    """
    if not hasattr(os, "geteuid"):
        return folder
    mask, me = current_umask(), os.geteuid()
    try:
        paths = [folder, *folder.rglob("*")] if folder.is_dir() else []
    except OSError:  # another user's folder: not ours to share
        return folder
    for p in paths:
        try:
            st = p.lstat()
            if st.st_uid != me or p.is_symlink():
                continue
            want = (0o555 if p.is_dir() else 0o444) & ~mask
            if st.st_mode & want != want:
                os.chmod(p, (st.st_mode & 0o7777) | want)
        except OSError:
            continue
    return folder


def _user(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"uid {uid}"


def permission_error(path: Path, entry: Path | None = None, *,
                     write: bool = False) -> CachePermissionError:
    """The error for a cache file this user may not read (or, ``write``, not write): it
    names the file, its owner and mode, and how to share it; ``entry`` is the folder to
    share (default: the file's own folder)."""
    entry = entry or path.parent
    probe = path
    while True:  # the file, or the nearest folder above it this user can see
        try:
            st = probe.stat()
            break
        except OSError:
            if probe.parent == probe:
                st = None
                break
            probe = probe.parent
    owner = _user(st.st_uid) if st is not None else "another user"
    mode = f"mode {st.st_mode & 0o777:04o}, " if st is not None else ""
    me = _user(os.geteuid()) if hasattr(os, "geteuid") else "this user"
    if write:
        return CachePermissionError(
            f"cannot take the lock {path}: it belongs to {owner} ({mode}not writable by "
            f"{me}); the cache {cache_root()} is shared, so its locks must be writable by "
            f"every user: ask {owner} to run `chmod -R a+rwX {path.parent}` (or give the "
            "users one group and umask 002), or set LOCOS_CACHE to a cache of your own")
    return CachePermissionError(
        f"{path} is not readable by {me}: it belongs to {owner} ({mode}written by an "
        f"older locos_tl or under a strict umask). The checkpoint is not damaged; ask "
        f"{owner} to run `chmod -R a+rX {entry}` (or `locos models fetch` as {owner}, "
        "which shares it by the umask), or set LOCOS_CACHE to a cache of your own")

