"""Every user-facing warning of locos_tl names the caller's line, not a line inside the
package or a jaxtyping/beartype/contextlib frame (:func:`locos_tl.errors.warn_caller`).

A warning attributed to a package frame points the user at code they did not write;
a ``DeprecationWarning`` attributed there is not even shown. The deprecations have
their own cases (tests/test_deprecations.py); here a representative set of the other
warnings, reached through public functions called from this file, and a scan that no
``warnings.warn`` with a hand-counted ``stacklevel`` is left in the package.
"""

from __future__ import annotations

import ast
import json
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import locos_tl as lt

PACKAGE = Path(lt.__file__).resolve().parent
#: the modules that may call ``warnings.warn`` themselves, and why
ALLOWED = {"errors.py": "warn_caller itself: warnings.warn with the level it counted"}


def _fake_model(n_layers: int = 2, n_heads: int = 4) -> SimpleNamespace:
    return SimpleNamespace(cfg=SimpleNamespace(n_layers=n_layers, n_heads=n_heads))


def _niah_trial_file(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps({"tokens": [1, 2, 3, 4], "needle_span": [1, 2],
                                "answer": "x", "meta": {"task": "niah"}}) + "\n")
    lt.load_trials(path)


def _all_zero_ranking(tmp_path: Path) -> None:
    lt.HeadScores("locos", torch.zeros(1, 2, 4)).top_k(1)


def _save_without_trials(tmp_path: Path) -> None:
    lt.HeadScores("locos", torch.zeros(0, 2, 4)).save(tmp_path / "run")


def _budget_below_floor(tmp_path: Path) -> None:
    lt.kv_budgets(np.array([[1.0, 0.0, 0.0, 0.0]]), 0.05, 100, 2, unit="query_head",
                  sinks=4, min_recent=8)


def _head_set_shorter_than_k(tmp_path: Path) -> None:
    from locos_tl.experiments.ablation_plan import plan_grid

    plan_grid(_fake_model(), {"m": ["L1H2"]}, [1, 2], 0, bottom=None)


def _no_twin(tmp_path: Path) -> None:
    from locos_tl.engine.twin import twin_info

    class Split:  # a device-mapped model: no twin
        original_model = SimpleNamespace(hf_device_map={"model.embed": 0, "lm_head": 1})

    twin_info(Split())


def _tokenizer_reload_fails(tmp_path: Path) -> None:
    from locos_tl.tokenize import bos_id

    class BridgeTokenizer:  # loaded by the bridge with add_bos_token=True, files gone
        init_kwargs = {"add_bos_token": True}
        name_or_path = str(tmp_path / "deleted-checkpoint")

    assert bos_id(BridgeTokenizer()) is None  # reaches checkpoint_tokenizer's reload


def _non_finite_trial(tmp_path: Path) -> None:
    from locos_tl.runs.trial import non_finite_record

    non_finite_record(lt.Trial(tokens=[1, 2, 3, 4], needle_span=(1, 2), answer="x"),
                      "NaN logits")


def _no_accepted_trial(tmp_path: Path) -> None:
    from locos_tl.runs.aggregate import aggregate
    from locos_tl.runs.trial import non_finite_record

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rec = non_finite_record(lt.Trial(tokens=[1, 2, 3, 4], needle_span=(1, 2),
                                         answer="x"), "NaN logits")
    aggregate([rec], ["locos"], model=_fake_model(), variant="raw", meta={})


def _stale_method_folder(tmp_path: Path) -> None:
    from locos_tl.runs.rundir import prune_stale_methods

    lt.HeadScores("wu", torch.ones(1, 2, 4)).save(tmp_path / "run" / "wu")
    prune_stale_methods(tmp_path / "run", ["locos"])


CASES = {
    "load_trials: NIAH trial without answer_span": (_niah_trial_file, UserWarning,
                                                    "NIAH trial written before"),
    "HeadScores.top_k: all scores 0": (_all_zero_ranking, RuntimeWarning, "every score is 0"),
    "HeadScores.save: no accepted trial": (_save_without_trials, RuntimeWarning,
                                           "no accepted trial"),
    "kv_budgets: below the floor": (_budget_below_floor, UserWarning, "below the floor"),
    "plan_grid: head set shorter than k": (_head_set_shorter_than_k, UserWarning,
                                           r"lists fewer heads than k=\[2\]"),
    "twin_info: no twin": (_no_twin, RuntimeWarning, "twin unavailable"),
    "bos_id: the tokenizer reload fails": (_tokenizer_reload_fails, UserWarning,
                                           "could not reload the tokenizer"),
    "non_finite_record": (_non_finite_trial, RuntimeWarning, "dropped \\(non_finite\\)"),
    "aggregate: no accepted trial": (_no_accepted_trial, RuntimeWarning,
                                     "no trial was accepted"),
    "prune_stale_methods: folder removed": (_stale_method_folder, UserWarning,
                                            "removed the folders of wu"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_warning_names_the_callers_file(case, tmp_path):
    trigger, category, match = CASES[case]
    with pytest.warns(category, match=match) as caught:
        trigger(tmp_path)
    ours = [w for w in caught if issubclass(w.category, category)]
    assert [w.filename for w in ours] == [__file__] * len(ours)


def test_a_context_managers_warning_names_the_with_line(tiny_models):
    """``intervene`` is a ``@contextmanager``: contextlib's ``__enter__`` sits between
    the warning and the ``with`` statement."""
    from locos_tl.engine import interventions

    model = tiny_models("llama")
    interventions._WARNED.discard(model)  # warned once a model
    hooks = [("blocks.0.hook_resid_pre", lambda x, hook: x)]  # no twin equivalent
    line = sys._getframe().f_lineno + 1
    with pytest.warns(RuntimeWarning) as caught, interventions.intervene(model, hooks):
        pass
    assert [str(w.message).split(";")[0] for w in caught] == [
        "interventions at ['blocks.0.hook_resid_pre'] have no module-hook equivalent on the "
        "fast SDPA twin"]
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)


def _warn_calls(tree: ast.AST) -> list[int]:
    """Lines calling ``warnings.warn`` or a ``warn`` imported from ``warnings``."""
    imported = {a.asname or a.name for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module == "warnings"
                for a in node.names if a.name == "warn"}
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Attribute) and node.func.attr == "warn"
         and isinstance(node.func.value, ast.Name) and node.func.value.id == "warnings")
        or (isinstance(node.func, ast.Name) and node.func.id in imported))]


def test_no_warning_of_the_package_counts_its_own_stacklevel():
    found = {f"{p.relative_to(PACKAGE)}:{line}"
             for p in sorted(PACKAGE.rglob("*.py")) if p.name not in ALLOWED
             for line in _warn_calls(ast.parse(p.read_text(), str(p)))}
    assert found == set(), "use locos_tl.errors.warn_caller"
    assert _warn_calls(ast.parse((PACKAGE / "errors.py").read_text())) != []  # the scan sees
