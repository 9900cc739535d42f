"""The package's folders follow the pipeline: each imports only from the layers below it,
and every public name stays importable (``tests/test_house.py`` checks the import graph
for cycles)."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "locos_tl"
#: layer of each top-level part of the package (the root's ``__init__`` is the public API
#: and may import anything, lazily)
LAYERS = {
    "errors": 0, "trials": 0, "trial_tokenizer": 0, "heads": 0, "head_spec": 0,
    "acceptance": 0, "tokenize": 0,
    "models": 1, "data": 2, "engine": 2, "organisms": 3, "detectors": 3, "plot": 4,
    "runs": 5, "experiments": 6, "cli": 7,
}
#: every public name of ``locos_tl`` (``locos_tl.__all__``) as of the package layout's
#: introduction; a name may be added, and renamed only before the first release
#: (CHANGELOG.md lists the renames)
PUBLIC = [
    "ablate", "AblationMeans", "answer_steps", "build_arithmetic_trials",
    "build_niah_trials", "build_nolima_trials", "build_parametric_trials",
    "calibrate_means", "compare_rankings", "corrupt_tokens", "DataFormatError",
    "DecodeResult", "DecodeStep", "DETECTORS", "dissociation_score",
    "expand_needle_set", "get_detector", "greedy_decode", "head_label", "HeadScores",
    "HeadSpecError", "load_ablation_sweep", "load_haystacks", "load_model", "load_needle_set",
    "load_niah_probes", "load_trials", "LocosError", "ModelLoadError", "parse_heads",
    "passes_gate", "patch_heads", "phi_from_pattern", "phi_from_model", "plot", "random_heads",
    "rouge1_recall", "rougeL_f", "save_trials", "score_trials", "spatial_contrast", "Trial",
    "TrialError",
]


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(path: Path) -> set[str]:
    """Every ``locos_tl`` module a file imports, at any depth (function bodies too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("locos_tl"):
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("locos_tl"))
    return found


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_no_import_from_a_higher_layer():
    modules = _modules()
    bad = []
    for name, path in modules.items():
        here = _part(name)
        if here is None:  # locos_tl/__init__.py: the public API
            continue
        for target in _imports(path):
            there = _part(target)
            if there is None or there not in LAYERS or target not in modules:
                continue
            if LAYERS[there] > LAYERS[here]:
                bad.append(f"{name} -> {target}")
    assert not bad, "imports from a higher layer:\n" + "\n".join(sorted(bad))


def test_root_holds_the_api_and_core_types_only():
    root = sorted(p.stem for p in PKG.glob("*.py"))
    assert len(root) <= 8, root
    assert set(root) - {"__init__"} <= {k for k, v in LAYERS.items() if v == 0}


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_is_importable(name):
    import locos_tl

    assert name in locos_tl.__all__
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert getattr(locos_tl, name) is not None


#: renamed before the first release, without an alias: old name -> new name
RENAMED_BEFORE_RELEASE = {"evaluate": "ablation_sweep", "load_evaluation": "load_ablation_sweep",
                          "phi_layer": "phi_from_pattern", "phi_tensor": "phi_from_model"}


@pytest.mark.parametrize("old", sorted(RENAMED_BEFORE_RELEASE))
def test_names_renamed_before_the_first_release_are_gone(old):
    import importlib.util

    import locos_tl

    assert RENAMED_BEFORE_RELEASE[old] in locos_tl.__all__
    assert old not in locos_tl.__all__
    with pytest.raises(AttributeError, match=f"no attribute '{old}'"):
        getattr(locos_tl, old)
    assert importlib.util.find_spec("locos_tl.cli.ablate_tf") is None
    assert importlib.util.find_spec("locos_tl.cli.ablate_teacher_forced") is not None


def test_notebooks_need_only_public_names():
    """What the notebooks import from locos_tl is exported at the top (organisms and
    plot are public sub-packages)."""
    import re

    import locos_tl

    cells = "".join(p.read_text() for p in (PKG.parent / "notebooks").glob("cells_*.py"))
    used = set(re.findall(r"\blocos_tl\.([a-zA-Z_]+)\b", cells))
    private = {m for m in re.findall(r"from locos_tl\.([a-z_.]+) import", cells)
               if m.split(".")[0] not in {"organisms", "plot", "data"}}
    assert not private, private
    assert used <= set(locos_tl.__all__) | {"organisms", "plot", "data"}, \
        used - set(locos_tl.__all__)
