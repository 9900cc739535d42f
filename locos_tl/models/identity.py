"""What a run records as its model: a name and content hashes, never a path.

A checkpoint of the cache (:mod:`locos_tl.models.gguf_cache`) sits at
``<cache root>/gguf/<sha256>/`` or ``<cache root>/elicited/<name>-<hash>/``, and the
cache root is ``$LOCOS_CACHE`` or the user's home: a path differs between machines and
users while the weights do not. So runs record a model's identity:

- ``settings["model"]``: its name: the zoo name (``smollm2-135m-instruct``,
  ``gemma-3-270m``, ``smollm2-135m-nolima``), the file name of a GGUF file prepared
  outside the zoo, a hub name, or, for any other local directory, its resolved path
  (nothing better identifies it);
- ``settings["model_hashes"]``: the content hashes of cache entries, ``gguf_sha256``
  (the GGUF file the weights were dequantized from) and, for an elicited model,
  ``adapter_sha256`` (its LoRA adapter's weights); absent for other checkpoints.

A run directory resumes when the two identities match (:func:`same_model`): same name,
and every hash both record is equal. Run directories written before (their
``settings["model"]`` is a cache path such as ``/root/.cache/locos_tl/gguf/<sha256>``)
are read as the identity the path encodes (:func:`identity_of`), whichever machine
wrote them.

Only the standard library is imported at module level.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: the settings key holding the content hashes (``{"gguf_sha256": ..., ...}``)
HASHES_KEY = "model_hashes"

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_ELICITED_DIR = re.compile(r"^(?P<name>.+)-(?P<hash>[0-9a-f]{16})$")
#: the shortest hash prefix compared (an elicited entry's folder keeps 16 hex digits)
_MIN_PREFIX = 16


@dataclass(frozen=True)
class ModelIdentity:
    """A checkpoint's name and content hashes.

    Attributes:
        name: the model's name (see the module docstring); None when a recorded cache
            path no longer tells it (a GGUF file prepared outside the zoo, on another
            machine): then only the hashes are compared.
        hashes: ``{"gguf_sha256": hex, "adapter_sha256": hex}``, those known; a hash
            read from an elicited entry's folder name is its first 16 hex digits.
    """

    name: str | None
    hashes: dict[str, str] = field(default_factory=dict)

    def settings(self) -> dict[str, Any]:
        """``{"model": name, "model_hashes": hashes}`` (no hashes key when none are
        known), the form run settings record."""
        out: dict[str, Any] = {"model": self.name}
        if self.hashes:
            out[HASHES_KEY] = dict(sorted(self.hashes.items()))
        return out

    def matches(self, other: ModelIdentity) -> bool:
        """True when both name the same model: names equal where both are known, every
        hash both know equal (a 16-digit prefix matches the full hash), and at least
        one of the two compared."""
        if self.name is not None and other.name is not None and self.name != other.name:
            return False
        common = self.hashes.keys() & other.hashes.keys()
        if any(not _same_hash(self.hashes[k], other.hashes[k]) for k in common):
            return False
        return bool(common) or (self.name is not None and self.name == other.name)

    def __str__(self) -> str:
        hashes = ", ".join(f"{k} {v[:16]}" for k, v in sorted(self.hashes.items()))
        name = repr(self.name) if self.name is not None else "an unnamed GGUF checkpoint"
        return f"{name} ({hashes})" if hashes else name


def _same_hash(a: str, b: str) -> bool:
    short, long = sorted((str(a), str(b)), key=len)
    return len(short) >= _MIN_PREFIX and long.startswith(short)


def zoo_name(gguf_sha256: str) -> str | None:
    """The zoo name of the GGUF file with this SHA-256, or None."""
    from locos_tl.models.zoo import REAL_MODELS

    return next((m.name for m in REAL_MODELS.values() if m.sha256 == gguf_sha256), None)


def _registry_identity(name: str) -> ModelIdentity | None:
    """The identity of a zoo name, from the registry (None: not a zoo name)."""
    from locos_tl.errors import ModelLoadError
    from locos_tl.models.zoo import ELICITED_MODELS, REAL_MODELS

    if name in REAL_MODELS:
        return ModelIdentity(name, {"gguf_sha256": REAL_MODELS[name].sha256})
    entry = ELICITED_MODELS.get(name)
    if entry is None:
        return None
    hashes = {"gguf_sha256": REAL_MODELS[entry.base].sha256}
    try:
        hashes["adapter_sha256"] = entry.adapter_sha256()
    except ModelLoadError:  # the adapter is not shipped here: the name alone
        pass
    return ModelIdentity(name, hashes)


def _record_identity(record: Mapping[str, Any], where: Path) -> ModelIdentity:
    """The identity of a cache entry from its ``gguf_source.json`` record."""
    if record.get("elicited"):
        hashes = {}
        if record.get("adapter_sha256"):
            hashes["adapter_sha256"] = str(record["adapter_sha256"])
        base = record.get("base_sha256") or Path(str(record.get("base_directory", ""))).name
        if _SHA256.match(str(base)):
            hashes["gguf_sha256"] = str(base)
        return ModelIdentity(str(record["elicited"]), hashes)
    sha = str(record.get("sha256") or where.name)
    if not _SHA256.match(sha):
        return ModelIdentity(str(where))
    name = zoo_name(sha) or record.get("registry_name") or record.get("file_name")
    return ModelIdentity(str(name) if name else None, {"gguf_sha256": sha})


def _path_identity(path: Path) -> ModelIdentity | None:
    """The identity a cache path encodes by its layout alone (the entry need not exist
    here): ``.../gguf/<sha256>`` or ``.../elicited/<name>-<16 hex>``; else None."""
    if path.parent.name == "gguf" and _SHA256.match(path.name):
        return ModelIdentity(zoo_name(path.name), {"gguf_sha256": path.name})
    m = _ELICITED_DIR.match(path.name)
    if path.parent.name == "elicited" and m:
        return ModelIdentity(m["name"], {"adapter_sha256": m["hash"]})
    return None


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a folder this user may not look into
        return False


def identity_of(name_or_path: str | os.PathLike[str]) -> ModelIdentity:
    """The identity of what a run names as its model.

    Args:
        name_or_path: a zoo name (its registry hashes); a cache entry's directory (its
            ``gguf_source.json``, else the name and hash its path encodes, so a path
            recorded on another machine still resolves); a hub name (itself); any other
            local directory (its resolved path).

    Returns:
        The :class:`ModelIdentity`. Never raises: an unreadable record falls back to
        what the path encodes.
    """
    text = str(name_or_path)
    found = _registry_identity(text)
    if found is not None and not _exists(Path(text)):
        return found
    path = Path(text).expanduser()
    looks_local = text.startswith((".", "/", "~")) or text.count("/") > 1
    if not (looks_local or _exists(path)):
        return ModelIdentity(text)  # a hub name
    from locos_tl.models.gguf_cache import read_source

    try:
        record = read_source(path) if path.is_dir() else None
    except OSError:  # unreadable (another user's entry): what its path says
        record = None
    if record is not None:
        return _record_identity(record, path)
    encoded = _path_identity(path)
    if encoded is not None:
        return encoded
    return ModelIdentity(str(path.resolve()) if _exists(path) else text)


def recorded_identity(settings: Mapping[str, Any]) -> ModelIdentity:
    """The model identity a run's settings record: ``settings["model"]`` (a name, or
    the cache path of a run written before identities were recorded) plus
    ``settings["model_hashes"]`` where present."""
    value = settings.get("model")
    if value is None:
        return ModelIdentity(None)
    recorded = settings.get(HASHES_KEY)
    text = str(value)
    if isinstance(recorded, Mapping) and recorded:  # a name written with its hashes
        return ModelIdentity(text, {str(k): str(v) for k, v in recorded.items()})
    legacy = text.startswith(("/", "~", ".")) or "\\" in text
    if legacy:
        return identity_of(text)
    return ModelIdentity(text)


def same_model(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether two run settings name the same model (:meth:`ModelIdentity.matches` of
    their :func:`recorded_identity`); a plain string comparison for anything that is
    not a cache checkpoint."""
    if old.get("model") == new.get("model") and old.get(HASHES_KEY) == new.get(HASHES_KEY):
        return True
    return recorded_identity(old).matches(recorded_identity(new))
