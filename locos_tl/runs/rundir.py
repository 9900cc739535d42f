"""The layout of a scoring run directory, one method or many, and its one loader.

A ``score_trials(out_dir=D)`` / ``locos score --out D`` run directory is one run (one
model, one set of settings, one trial set; :class:`~locos_tl.runs.records.RecordStore`
refuses anything else)::

    D/trials.jsonl        one record per finished trial (the source of truth; resumable)
    D/meta.json           provenance; settings["methods"] lists the run's methods
    D/scores.csv          one row a head and method (column ``method``), every method
    D/<method>/           one folder a method, also when there is only one:
        scores.csv, heads.json (reference format), head_scores.json, heatmap.html

``score_trials`` writes ``trials.jsonl`` and ``meta.json``; ``locos score`` adds the
rest (:func:`write_method_dirs`). Method folders of methods the run's ``meta.json`` no
longer lists (a rerun with another ``--method``) are removed, never left stale.
:func:`load_head_scores` reads any of: such a run directory (the method folder, or the
records when ``score_trials`` wrote only those), one method folder (``D/wu``, which
works even when only the records exist), a :meth:`HeadScores.save` directory, or a
reference ``heads.json`` directory.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from locos_tl.errors import LocosError, warn_caller
from locos_tl.heads import HeadScores
from locos_tl.runs.records import META_FILE, RECORDS_FILE, read_records

#: The files of one method's folder (written by ``locos score``).
METHOD_FILES = ("scores.csv", "heads.json", "head_scores.json", "heatmap.html")
#: The method preferred when a run with several methods is read without naming one.
DEFAULT_METHOD = "locos"


def run_methods(path: str | Path) -> list[str] | None:
    """The methods a scoring run directory's ``meta.json`` lists, or None when ``path``
    holds no scoring run (no ``meta.json``, or one without ``settings.methods``)."""
    meta_path = Path(path) / META_FILE
    if not meta_path.exists():
        return None
    try:
        methods = json.loads(meta_path.read_text()).get("settings", {}).get("methods")
    except (OSError, ValueError, AttributeError):
        return None
    return [str(m) for m in methods] if isinstance(methods, list) else None


def kept_methods(path: str | Path, methods: Iterable[str]) -> list[str]:
    """The methods a run directory already holds that ``methods`` leaves out.

    A rescoring with fewer methods deletes nothing, from Python and from the command
    line alike: the runner scores these too (from the same per-trial records), so their
    folders stay current (:func:`locos_tl.score_trials`, ``locos score``).
    """
    from locos_tl.runs.records import RECORDS_FILE

    if not (Path(path) / RECORDS_FILE).exists():
        return []
    want = list(methods)
    return [m for m in run_methods(path) or [] if m not in want]


def _is_method_dir(d: Path) -> bool:
    """Whether ``d`` holds only files a method folder holds (plus plotly's script)."""
    return d.is_dir() and (d / "head_scores.json").exists() and all(
        p.is_file() and (p.name in METHOD_FILES or p.suffix == ".js") for p in d.iterdir()
    )


def _saved_method(path: Path) -> str | None:
    try:
        return str(json.loads(path.read_text())["method"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _csv_methods(path: Path) -> set[str]:
    try:
        header, *rows = path.read_text().splitlines()
        col = header.split(",").index("method")
        return {r.split(",")[col] for r in rows if r}
    except (OSError, ValueError, IndexError):
        return set()


def prune_stale_methods(
    out_dir: str | Path, methods: Iterable[str], *, top_level: bool = False
) -> list[str]:
    """Remove what run directory ``out_dir`` holds for methods other than ``methods``.

    Removes the method folders (``D/<m>/`` holding only method files) of other methods,
    the top-level ``scores.csv`` when it lists another method, and the per-method files
    an older layout kept at the top level (``heads.json``, ``head_scores.json``,
    ``heatmap.html``) when they belong to another method, or always with
    ``top_level=True`` (the writer of the method folders). A folder holding other files
    is left alone.

    Returns:
        The names removed (``"wu/"``, ``"heads.json"``, ...).
    """
    out = Path(out_dir)
    keep = set(methods)
    removed: list[str] = []
    if not out.is_dir():
        return removed
    for d in sorted(out.iterdir()):
        if d.name not in keep and _is_method_dir(d):
            shutil.rmtree(d)
            removed.append(f"{d.name}/")
    legacy = out / "head_scores.json"
    if (out / RECORDS_FILE).exists() and (top_level or (
            legacy.exists() and _saved_method(legacy) not in keep)):
        for name in ("heads.json", "head_scores.json", "heatmap.html"):
            if (out / name).is_file():
                (out / name).unlink()
                removed.append(name)
    if (out / RECORDS_FILE).exists() and _csv_methods(out / "scores.csv") - keep:
        (out / "scores.csv").unlink()
        removed.append("scores.csv")
    gone = [r[:-1] for r in removed if r.endswith("/")]
    if gone:  # never silently (`locos score` keeps them: it scores every method of a run)
        warn_caller(f"{out}: removed the folders of {', '.join(gone)}, methods this run "
                    f"does not score ({', '.join(sorted(keep))}); include them in methods "
                    "to keep them (their trial records are reused)", UserWarning)
    return removed


def write_method_dirs(
    result: HeadScores | dict[str, HeadScores], out_dir: str | Path
) -> dict[str, Path]:
    """Write ``D/<method>/`` (scores.csv, heads.json, head_scores.json) for every method
    and ``D/scores.csv`` of all methods; remove other methods' folders.

    Returns:
        ``{method: folder}``.
    """
    import pandas as pd

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = result if isinstance(result, dict) else {result.method: result}
    prune_stale_methods(out, results, top_level=True)
    paths = {m: hs.save(out / m) for m, hs in results.items()}
    pd.concat([hs.to_frame() for hs in results.values()]).to_csv(out / "scores.csv",
                                                                   index=False)
    return paths


def _choose(path: Path, methods: list[str], method: str | None) -> str:
    if method is not None:
        if method not in methods:
            from locos_tl.detectors import DETECTORS

            if method not in DETECTORS:
                raise LocosError(f"{path} holds scores of {', '.join(methods)}; {method!r} is "
                                 f"no method (methods: {', '.join(sorted(DETECTORS))})")
            raise LocosError(f"{path} holds scores of {', '.join(methods)}, not of {method!r}"
                             f"; score it with --method {method} (into a new --out)")
        return method
    if len(methods) == 1:
        return methods[0]
    if DEFAULT_METHOD in methods:
        return DEFAULT_METHOD
    raise LocosError(
        f"{path} holds scores of several methods ({', '.join(methods)}): name one, as "
        + " or ".join(str(path / m) for m in methods) + " (method=... in Python)"
    )


def _from_records(path: Path, method: str) -> HeadScores:
    meta: dict[str, Any] = json.loads((path / META_FILE).read_text())
    settings = meta.get("settings", {})
    records = read_records(path)
    n = settings.get("n_trials")
    if n is not None and len(records) < int(n):
        raise LocosError(f"{path} holds an unfinished run ({len(records)} of {n} trials "
                         "scored): rerun the same score command to finish it")
    shape = meta.get("model", {})
    if "n_layers" not in shape or "n_heads" not in shape:
        raise LocosError(f"{path}/{META_FILE} does not record the model's shape")
    from types import SimpleNamespace

    from locos_tl.runs.aggregate import aggregate  # the one path from records to HeadScores
    from locos_tl.runs.options import ScoreOptions

    options = ScoreOptions.from_settings(settings)  # the run's options, read back
    dims = SimpleNamespace(cfg=SimpleNamespace(n_layers=int(shape["n_layers"]),
                                               n_heads=int(shape["n_heads"])))
    return aggregate(list(records.values()), [method], model=dims,  # type: ignore[return-value]
                     variant=options.variant, meta=meta, seed=options.seed, as_dict=False,
                     warn=False)


def load_head_scores(path: str | Path, method: str | None = None) -> HeadScores:
    """Read the head scores of one method from any directory the package writes.

    Accepts a scoring run directory (one method or several, see the module layout), one
    of its method folders (``runs/x/wu``; read from the records when ``score_trials``
    wrote no folder), a :meth:`HeadScores.save` directory (e.g. ``locos patch``'s CRI),
    or a directory holding a reference ``heads.json``; or one file: a reference
    ``heads.json`` (any name ending ``.json``) or a ``head_scores.json``.

    Args:
        path: the directory or file.
        method: the method to read; None: the run's only method, else ``"locos"`` when
            the run has it.

    Returns:
        The method's :class:`HeadScores`.

    Raises:
        LocosError: several methods and none chosen (the message lists the method
            folders to pass), a method the directory does not hold, or an unfinished
            run.
        FileNotFoundError: nothing loadable at ``path``.
    """
    p = Path(path)
    if p.is_file():
        if p.name == "head_scores.json":
            hs = HeadScores.load(p.parent)
        elif p.suffix == ".json":
            hs = HeadScores.from_reference_json(p)
        else:
            raise FileNotFoundError(f"{p} is a file but not head scores (a heads.json or "
                                    "head_scores.json); pass it or its directory")
        if method is not None and hs.method != method:
            raise LocosError(f"{p} holds {hs.method!r} scores, not {method!r}")
        return hs
    saved = (p / "head_scores.json").exists()
    methods = run_methods(p)
    if saved or ((p / "heads.json").exists() and methods is None):
        hs = HeadScores.load(p)
        if method is not None and hs.method != method and saved:
            raise LocosError(f"{p} holds {hs.method!r} scores, not {method!r}")
        return hs
    if methods is None and not p.exists() and run_methods(p.parent) is not None:
        if method is not None and method != p.name:  # runs/x/wu with method="locos"
            raise LocosError(f"{p} names method {p.name!r} but method={method!r} was asked")
        return load_head_scores(p.parent, p.name)  # runs/x/<method>, no folder written
    if methods is None:
        subs = sorted(d.name for d in p.glob("*/") if (d / "head_scores.json").exists())
        if not subs:
            if not p.exists():
                raise FileNotFoundError(f"{p} does not exist")
            raise FileNotFoundError(
                f"no head scores in {p}: expected a `locos score` run directory "
                "(meta.json + trials.jsonl), a method folder or a head_scores.json / "
                "heads.json file"
            )
        return HeadScores.load(p / _choose(p, subs, method))
    from locos_tl.detectors import DETECTORS

    if (method is not None and method not in DETECTORS
            and (p / method / "head_scores.json").exists()):
        return HeadScores.load(p / method)  # AtP, QRHead, CRI: own folder, own records
    chosen = _choose(p, methods, method)
    if (p / chosen / "head_scores.json").exists():
        return HeadScores.load(p / chosen)
    return _from_records(p, chosen)
