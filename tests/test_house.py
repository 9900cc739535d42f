"""The import graph of ``locos_tl/``, ``benchmarks/`` and ``experiments/``: no cycles,
and the pipeline packages never import the package root (its lazy public API).

Every import counts, at any depth (function bodies too), and so do imports by a constant
string (``importlib.import_module("...")``, ``runpy.run_module("...")``,
``importlib.util.spec_from_file_location("name", ...)``): a cycle hidden in a function
or a string is still a cycle. ``tests/test_layout.py`` checks the layer order."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "locos_tl"
#: folders of locos_tl that must not import the package root (``import locos_tl``,
#: ``from locos_tl import NAME`` of a public name): they sit below the public API
NO_ROOT = ("experiments", "models", "engine", "detectors", "runs", "data")
#: calls whose first argument, a string constant, names a module they import
STRING_IMPORTS = {"import_module", "run_module", "spec_from_file_location"}


def _package_modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _script_modules(folder: str) -> dict[str, Path]:
    """The scripts of ``folder`` (``benchmarks``, ``experiments``) import each other by
    their file names (the script's folder is on ``sys.path``)."""
    return {p.stem: p for p in (REPO / folder).glob("*.py")}


def _targets(name: str, path: Path) -> list[tuple[str, int, bool]]:
    """``(imported name, line, named)`` for every import in the file, at any depth;
    relative imports resolved against ``name``. ``named``: a name of a ``from ...
    import`` (``from a import b`` gives ``("a", line, False)`` and ``("a.b", line,
    True)``: ``a`` is imported either way, ``a.b`` only if it is a module)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: list[tuple[str, int, bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno, False) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            found.append((base, node.lineno, False))
            found += [(f"{base}.{a.name}", node.lineno, True) for a in node.names]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            arg = node.args[0]
            if called in STRING_IMPORTS and isinstance(arg, ast.Constant) \
                    and isinstance(arg.value, str):
                found.append((arg.value, node.lineno, False))
    return found


def _resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The longest known module that ``target`` names (``a.b.NAME`` -> ``a.b``)."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def import_graph(modules: dict[str, Path], root: str | None) -> dict[str, set[str]]:
    """Module -> modules it imports. Left out: a package ``__init__`` importing its own
    modules (a re-export) and imports of ``root``, the lazy public API, which imports
    nothing at import time (the next test keeps the pipeline off it)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for target, _, _ in _targets(name, path):
            t = _resolve(target, modules)
            if t is None or t == name or t == root or t.startswith(name + "."):
                continue
            edges.add(t)
        graph[name] = edges
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module, or a module
    importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return comps


@pytest.mark.parametrize("part", ["locos_tl", "benchmarks", "experiments"])
def test_no_import_cycles(part):
    if part == "locos_tl":
        graph = import_graph(_package_modules(), root="locos_tl")
    else:
        graph = import_graph(_script_modules(part), root=None)
    cycles = find_cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def root_imports(modules: dict[str, Path], root: str = "locos_tl") -> list[str]:
    """``file:line: what`` for each import of the package root in the ``NO_ROOT``
    folders: ``import locos_tl`` (``as lt``), or ``from locos_tl import NAME`` of a name
    the root module defines. ``from locos_tl import trials`` (a root module: the core
    types) or ``plot`` (a package) is fine."""
    bad = []
    for name, path in modules.items():
        parts = name.split(".")
        if len(parts) < 2 or parts[1] not in NO_ROOT:
            continue
        found = _targets(name, path)
        names = {(t, ln) for t, ln, named in found if named}
        for target, line, named in found:
            if named:
                if target.count(".") == 1 and _resolve(target, modules) == root:
                    bad.append(f"{path}:{line}: from {root} import {target.split('.')[1]}")
            elif target == root and not any(
                    ln == line and t.startswith(root + ".") for t, ln in names):
                bad.append(f"{path}:{line}: import {root}")
    return sorted(set(bad))


def test_pipeline_packages_do_not_import_the_package_root():
    bad = root_imports(_package_modules())
    assert not bad, "imports of the package root:\n" + "\n".join(bad)


def test_the_checks_see_hidden_imports(tmp_path):
    """A function-level import and an ``importlib.import_module`` string both count."""
    (tmp_path / "a.py").write_text("def f():\n    from b import x\n")
    (tmp_path / "b.py").write_text(
        "import importlib\nx = 1\ndef g():\n    importlib.import_module('a')\n")
    modules = {p.stem: p for p in tmp_path.glob("*.py")}
    assert find_cycles(import_graph(modules, root=None)) == [["a", "b"]]


def test_the_root_check_tells_modules_from_public_names(tmp_path):
    pkg = tmp_path / "locos_tl"
    (pkg / "engine").mkdir(parents=True)
    for f in ("__init__.py", "trials.py", "engine/__init__.py"):
        (pkg / f).write_text("")
    (pkg / "engine" / "a.py").write_text(
        "from locos_tl import trials\ndef f():\n    import locos_tl as lt\n"
        "    from locos_tl import load_model\n")
    modules = {".".join(p.relative_to(tmp_path).with_suffix("").parts).removesuffix(
        ".__init__"): p for p in pkg.rglob("*.py")}
    bad = root_imports(modules)
    assert [b.split(": ", 1)[1] for b in bad] == ["import locos_tl",
                                                 "from locos_tl import load_model"]
