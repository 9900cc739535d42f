"""Loaders for the benchmarks the method uses, from the Hugging Face hub or a local path.

- NoLiMa needle sets and shuffled book haystacks (Modarressi et al. 2025, arXiv
  2502.05167): dataset repo ``amodaresi/NoLiMa`` (non-commercial research licence).
- MuSiQue, answerable subset, validation split (Trivedi et al. 2022, arXiv
  2108.00573): ``musique_ans_v1.0_dev.jsonl`` from ``dgslibisey/MuSiQue``.
- BABILong qa2 / qa3 (Kuratov et al. 2024, arXiv 2406.10149): ``RMT-team/babilong``.
- The parametric / arithmetic specificity control of Gema, Alex & Minervini (2026,
  arXiv 2607.01002): ``aryopg/parametric-arithmetic-eval``.

Every loader accepts a local path instead (a file, or a folder laid out like the hub
repo). Without a path and without network (``HF_HUB_OFFLINE=1``, or the hub not
reachable within a few seconds) a loader fails at once with
:class:`HubUnavailableError`, whose message says what to download and where to put it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from locos_tl.data.haystack import Haystack, load_haystacks
from locos_tl.data.nolima import NoLiMaEntry, load_needle_set
from locos_tl.errors import DataFormatError, LocosError

NOLIMA_REPO = "amodaresi/NoLiMa"
MUSIQUE_REPO = "dgslibisey/MuSiQue"
MUSIQUE_FILE = "musique_ans_v1.0_dev.jsonl"
BABILONG_REPO = "RMT-team/babilong"
PARAMETRIC_REPO = "aryopg/parametric-arithmetic-eval"
#: Seconds allowed for the hub reachability probe before a loader gives up.
PROBE_TIMEOUT_S = 3.0


class HubUnavailableError(LocosError, RuntimeError):
    """A dataset is not cached locally and the hub cannot be reached (offline)."""


@dataclass(frozen=True)
class NoLiMaFiles:
    """Paths of a NoLiMa download: the needle set and the shuffled haystack books."""

    root: Path
    needle_set: Path
    haystacks: tuple[Path, ...]


@dataclass(frozen=True)
class MusiqueExample:
    """One answerable MuSiQue question with its 20 paragraphs (title, text, supporting)."""

    id: str
    question: str
    answer: str
    answer_aliases: tuple[str, ...]
    paragraphs: tuple[tuple[str, str, bool], ...]


@dataclass(frozen=True)
class BabiLongExample:
    """One BABILong sample: long ``input`` text, ``question`` and ``target`` answer."""

    input: str
    question: str
    target: str
    task: str = ""
    length: str = ""


@dataclass(frozen=True)
class ControlExample:
    """One specificity-control question (answered from the weights, not the context)."""

    question: str
    answer: str
    category: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------- NoLiMa
def fetch_nolima(
    local_dir: str | Path | None = None,
    *,
    needle_set: str = "needle_set.json",
    cache_dir: str | Path | None = None,
) -> NoLiMaFiles:
    """Locate (or download) a NoLiMa needle set and its haystack books.

    Args:
        local_dir: a folder laid out like the hub repo (``needlesets/<needle_set>``,
            ``haystack/rand_shuffle/*.txt``); the needle set and books are also found
            elsewhere below it. ``None`` downloads from ``amodaresi/NoLiMa``.
        needle_set: file name, e.g. ``needle_set.json`` or
            ``needle_set_w_Distractor.json``.
        cache_dir: Hugging Face cache folder (default: the usual HF cache).

    Raises:
        HubUnavailableError: no ``local_dir``, not cached, and no network.
        DataFormatError: the needle set or the books are not in the folder.
    """
    if local_dir is None:
        local_dir = _snapshot(
            NOLIMA_REPO, [f"needlesets/{needle_set}", "haystack/rand_shuffle/*"],
            what=f"the NoLiMa needle set {needle_set} and haystacks", cache_dir=cache_dir,
        )
    root = Path(local_dir)
    if not root.is_dir():
        raise DataFormatError(f"NoLiMa folder {root} does not exist")
    sets = sorted(root.rglob(needle_set))
    if not sets:
        raise DataFormatError(
            f"no {needle_set} found under {root} (expected needlesets/{needle_set})"
        )
    books = sorted((root / "haystack" / "rand_shuffle").glob("*.txt")) or sorted(
        p for p in root.rglob("*.txt") if "haystack" in p.parts
    )
    if not books:
        raise DataFormatError(f"no haystack books (*.txt) under {root}/haystack")
    return NoLiMaFiles(root, sets[0], tuple(_natural_sorted(books)))


def load_nolima(
    local_dir: str | Path | None = None,
    *,
    needle_set: str = "needle_set.json",
    cache_dir: str | Path | None = None,
) -> tuple[list[NoLiMaEntry], list[Haystack]]:
    """Validated NoLiMa entries and haystacks (see :func:`fetch_nolima`).

    Raises:
        HubUnavailableError, DataFormatError: as :func:`fetch_nolima` and
            :func:`~locos_tl.data.nolima.load_needle_set`.
    """
    files = fetch_nolima(local_dir, needle_set=needle_set, cache_dir=cache_dir)
    return load_needle_set(files.needle_set), load_haystacks(files.haystacks)


# ---------------------------------------------------------------------- MuSiQue
def load_musique(
    path: str | Path | None = None,
    *,
    limit: int | None = None,
    cache_dir: str | Path | None = None,
) -> list[MusiqueExample]:
    """MuSiQue answerable validation questions (``musique_ans_v1.0_dev.jsonl``).

    Args:
        path: the JSON-lines file, or a folder containing it; ``None`` downloads it
            from ``dgslibisey/MuSiQue``.
        limit: keep the first ``limit`` answerable questions.
        cache_dir: Hugging Face cache folder.

    Raises:
        HubUnavailableError: no path, not cached, and no network.
        DataFormatError: missing file or a record without ``question``/``answer``/
            ``paragraphs`` (names the line).
    """
    if path is None:
        path = _file(MUSIQUE_REPO, MUSIQUE_FILE, what="MuSiQue (answerable, validation)",
                     cache_dir=cache_dir)
    p = Path(path)
    if p.is_dir():
        p = p / MUSIQUE_FILE
    out = []
    for i, d in enumerate(_read_records(p), 1):
        if d.get("answerable", True) is False:
            continue
        for f in ("question", "answer", "paragraphs"):
            if f not in d:
                raise DataFormatError(f"{p}: record {i}: missing field {f!r}")
        paras = tuple(
            (str(q.get("title", "")), str(q["paragraph_text"]), bool(q.get("is_supporting", False)))
            for q in d["paragraphs"]
        )
        out.append(MusiqueExample(str(d.get("id", i)), d["question"], d["answer"],
                                  tuple(d.get("answer_aliases") or ()), paras))
        if limit is not None and len(out) >= limit:
            break
    return out


# --------------------------------------------------------------------- BABILong
def load_babilong(
    task: str = "qa2",
    length: str = "4k",
    path: str | Path | None = None,
    *,
    limit: int | None = None,
    cache_dir: str | Path | None = None,
) -> list[BabiLongExample]:
    """BABILong samples of one task (``qa2``, ``qa3``, ...) at one length (``"4k"``).

    Args:
        task: the bAbI task (the dataset split).
        length: the context length config (``"0k"``, ``"1k"``, ... ``"128k"``).
        path: a local ``.jsonl``/``.json``/``.parquet`` file or a
            ``Dataset.save_to_disk`` folder with ``input``, ``question``, ``target``;
            ``None`` loads ``RMT-team/babilong`` with ``datasets``.
        limit: keep the first ``limit`` samples.
        cache_dir: datasets cache folder.

    Raises:
        HubUnavailableError: no path and no network.
        DataFormatError: records without ``input``/``question``/``target``.
    """
    if path is None:
        records = _load_dataset(BABILONG_REPO, length, task, what=f"BABILong {task} at {length}",
                                cache_dir=cache_dir)
        src = f"{BABILONG_REPO}[{length}/{task}]"
    else:
        records, src = _read_records(Path(path)), str(path)
    out = []
    for i, d in enumerate(records, 1):
        for f in ("input", "question", "target"):
            if f not in d:
                raise DataFormatError(f"{src}: record {i}: missing field {f!r}")
        out.append(BabiLongExample(d["input"], d["question"], str(d["target"]), task, length))
        if limit is not None and len(out) >= limit:
            break
    return out


# ------------------------------------------------------------ specificity controls
_Q_KEYS = ("question", "prompt", "input", "query")
_A_KEYS = ("answer", "target", "gold", "label", "answers")
_C_KEYS = ("category", "type", "task", "subset", "kind")


def load_parametric_controls(
    path: str | Path | None = None,
    *,
    split: str | None = None,
    cache_dir: str | Path | None = None,
) -> list[ControlExample]:
    """Parametric-knowledge and 1-digit arithmetic control questions.

    Args:
        path: local ``.jsonl``/``.json``/``.parquet`` file or ``save_to_disk`` folder;
            ``None`` loads ``aryopg/parametric-arithmetic-eval``.
        split: one split; ``None`` concatenates all splits (the split name goes in
            ``meta["split"]``).
        cache_dir: datasets cache folder.

    Raises:
        HubUnavailableError: no path and no network.
        DataFormatError: a record without a question or answer column (the message
            lists the columns found).
    """
    if path is None:
        records = _load_dataset(PARAMETRIC_REPO, None, split,
                                what="the parametric/arithmetic control set", cache_dir=cache_dir)
        src = PARAMETRIC_REPO
    else:
        records, src = _read_records(Path(path)), str(path)
    out = []
    for i, d in enumerate(records, 1):
        q, a = _first(d, _Q_KEYS), _first(d, _A_KEYS)
        if q is None or a is None:
            raise DataFormatError(
                f"{src}: record {i} lacks a question ({'/'.join(_Q_KEYS)}) or answer "
                f"({'/'.join(_A_KEYS)}) column; columns: {sorted(d)}"
            )
        if isinstance(a, list):
            a = a[0] if a else ""
        cat = _first(d, _C_KEYS)
        used = {k for k in (*_Q_KEYS, *_A_KEYS, *_C_KEYS) if k in d}
        meta = {k: v for k, v in d.items() if k not in used}
        out.append(ControlExample(str(q), str(a), str(cat or ""), meta))
    return out


# -------------------------------------------------------------------- tokenizer
def load_tokenizer(name_or_dir: str | Path) -> Any:
    """A fast tokenizer from a local folder (offline) or a hub model name.

    Args:
        name_or_dir: folder with ``tokenizer.json`` / ``tokenizer_config.json``, a
            hub id such as ``Qwen/Qwen3-8B`` (used from the cache when offline), a known
            real model (:mod:`locos_tl.models.zoo`) or a ``.gguf`` file (its prepared folder).

    Raises:
        HubUnavailableError: a hub name that is not cached while offline.
        DataFormatError: the folder or name holds no usable fast tokenizer.
    """
    from transformers import AutoTokenizer

    from locos_tl.errors import ModelLoadError
    from locos_tl.models.zoo import resolve_checkpoint

    try:  # a known real model (locos models fetch) or a .gguf file: its prepared folder
        name_or_dir = resolve_checkpoint(name_or_dir) or name_or_dir
    except ModelLoadError as exc:
        raise DataFormatError(str(exc)) from exc
    p = Path(name_or_dir)
    if not p.exists() and (str(name_or_dir).startswith((".", "/", "~"))
                           or str(name_or_dir).count("/") > 1):
        raise DataFormatError(f"tokenizer directory {p} does not exist")
    if p.is_dir():
        try:
            tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
        except Exception as exc:  # noqa: BLE001
            raise DataFormatError(f"no usable tokenizer in {p} ({exc})") from exc
    else:
        name = str(name_or_dir)
        try:
            tok = AutoTokenizer.from_pretrained(name, local_files_only=True)
        except Exception:  # noqa: BLE001 - not cached
            what = f"the tokenizer of {name}"
            if hub_offline():
                raise HubUnavailableError(
                    f"cannot load {what}: offline mode is set (HF_HUB_OFFLINE=1) and it is not "
                    f"cached. Download it with `hf download {name} --include 'tokenizer*' "
                    "--local-dir DIR` and pass DIR"
                ) from None
            _check_online(what, name, "--include 'tokenizer*' ", repo_type="model")
            try:
                tok = AutoTokenizer.from_pretrained(name)
            except Exception as exc:  # noqa: BLE001
                raise DataFormatError(f"cannot load tokenizer {name!r} ({exc})") from exc
    if not getattr(tok, "is_fast", False):
        raise DataFormatError(f"tokenizer {name_or_dir} is not a fast tokenizer (offsets needed)")
    return tok


# -------------------------------------------------------------------- plumbing
def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` is set (read now)."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return True
    return False


def hub_problem(repo: str, repo_type: str = "dataset", timeout: float | None = None) -> str | None:
    """Ask the hub API about ``repo``; ``None`` if it answers, else why not.

    The request runs in a daemon thread, so a hanging name lookup or a silent proxy
    cannot block the caller for longer than ``timeout`` seconds (default
    :data:`PROBE_TIMEOUT_S`). Any answer other than HTTP 200/401/403 (gated) counts as
    unreachable.
    """
    import urllib.error
    import urllib.request

    timeout = PROBE_TIMEOUT_S if timeout is None else timeout
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    kind = "datasets" if repo_type == "dataset" else "models"
    url = f"{endpoint}/api/{kind}/{repo}"
    result: list[str | None] = []

    def probe() -> None:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                result.append(None if r.status == 200 else f"HTTP {r.status} from {url}")
        except urllib.error.HTTPError as exc:
            result.append(None if exc.code in (401, 403) else f"HTTP {exc.code} from {url}")
        except Exception as exc:  # noqa: BLE001 - DNS, refused, timeout, TLS
            result.append(f"no answer from {url} ({type(exc).__name__})")

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    return result[0] if result else f"no answer from {url} within {timeout:g} s"


def _unavailable(
    what: str, repo: str, hint: str, why: str, repo_type: str = "dataset"
) -> HubUnavailableError:
    kind = "--repo-type dataset " if repo_type == "dataset" else ""
    return HubUnavailableError(
        f"cannot load {what}: {why}. Download it on a machine with network, e.g. "
        f"`hf download {kind}{repo} {hint}--local-dir DIR`, "
        "copy DIR here and pass its path to the loader (or the CLI option), or fill the "
        "Hugging Face cache and unset HF_HUB_OFFLINE."
    )


def _check_online(what: str, repo: str, hint: str = "", repo_type: str = "dataset") -> None:
    if hub_offline():
        raise _unavailable(what, repo, hint, "offline mode is set (HF_HUB_OFFLINE=1)", repo_type)
    problem = hub_problem(repo, repo_type)
    if problem:
        raise _unavailable(what, repo, hint, f"the hub is not reachable: {problem}", repo_type)



def _snapshot(repo: str, patterns: Sequence[str], *, what: str,
              cache_dir: str | Path | None) -> Path:
    from huggingface_hub import snapshot_download

    kw: dict[str, Any] = dict(repo_id=repo, repo_type="dataset", allow_patterns=list(patterns),
                              cache_dir=cache_dir)
    try:
        return Path(snapshot_download(local_files_only=True, **kw))
    except Exception:  # noqa: BLE001 - not cached: fall through to the network
        pass
    _check_online(what, repo)
    try:
        return Path(snapshot_download(**kw))
    except Exception as exc:  # noqa: BLE001
        raise _unavailable(what, repo, "", f"download failed ({exc})") from exc


def _file(repo: str, filename: str, *, what: str, cache_dir: str | Path | None) -> Path:
    from huggingface_hub import hf_hub_download

    kw: dict[str, Any] = dict(repo_id=repo, filename=filename, repo_type="dataset",
                              cache_dir=cache_dir)
    try:
        return Path(hf_hub_download(local_files_only=True, **kw))
    except Exception:  # noqa: BLE001 - not cached
        pass
    _check_online(what, repo, f"{filename} ")
    try:
        return Path(hf_hub_download(**kw))
    except Exception as exc:  # noqa: BLE001
        raise _unavailable(what, repo, f"{filename} ", f"download failed ({exc})") from exc


def _load_dataset(repo: str, config: str | None, split: str | None, *, what: str,
                  cache_dir: str | Path | None) -> list[dict[str, Any]]:
    _check_online(what, repo)
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - optional extra
        raise HubUnavailableError(
            f"loading {what} from the hub needs `datasets` (pip install 'locos_tl[hub]'), "
            "or pass a local file"
        ) from exc
    try:
        ds = datasets.load_dataset(repo, config, split=split,
                                   cache_dir=str(cache_dir) if cache_dir else None)
    except Exception as exc:  # noqa: BLE001
        raise _unavailable(what, repo, "", f"loading failed ({exc})") from exc
    if isinstance(ds, datasets.DatasetDict):
        rows = []
        for name, part in ds.items():
            rows.extend({**r, "split": name} for r in part)
        return rows
    return [dict(r) for r in ds]


def _read_records(path: Path) -> list[dict[str, Any]]:
    """Records from a ``.jsonl``, ``.json``, ``.parquet`` file or a ``save_to_disk`` folder."""
    if not path.exists():
        raise DataFormatError(f"data file {path} does not exist")
    if path.is_dir():
        import datasets

        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            return [{**r, "split": n} for n, part in ds.items() for r in part]
        return [dict(r) for r in ds]
    if path.suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict(orient="records")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataFormatError(f"{path} is not valid JSON ({exc})") from exc
        if isinstance(data, dict) and "data" in data:
            data = data["data"]
        if not isinstance(data, list):
            raise DataFormatError(f"{path}: expected a JSON list of records")
        return data
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataFormatError(f"{path}:{i}: not valid JSON ({exc})") from exc
    return rows


def _first(d: dict[str, Any], keys: Sequence[str]) -> Any:
    for k in keys:
        if k in d and d[k] is not None:
            return d[k]
    return None


def _natural_sorted(paths: Sequence[Path]) -> list[Path]:
    import re

    def key(p: Path) -> list[Any]:
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]

    return sorted(paths, key=key)
