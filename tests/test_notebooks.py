"""Execute the example notebooks top to bottom (nbclient); any error fails.

Marked ``notebooks`` (run with ``pytest -m notebooks``): each takes a few minutes on a
CPU. Uses the shipped organism and the books shipped with locos_tl. The committed
notebooks are generated and executed by ``notebooks/make_notebooks.py --execute``. Tests
on the committed files (no execution, no mark): their cells are exactly the generator's,
every code cell carries its outputs, every figure carries a PNG beside its plotly JSON,
and every notebook ends with "What we found".
"""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
#: Every generated notebook (``NN_name.ipynb``), so a new one is tested without a list here.
NAMES = sorted(p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
#: A hang guard, not a speed target: nbclient's limit for one cell. The notebooks take
#: 10-70 s each on an idle 2-core CPU; a shared machine may take many times that, and
#: speed belongs to the benchmarks, so no test asserts wall time.
CELL_TIMEOUT_S = 1800


def _generator():
    import importlib.util

    pytest.importorskip("nbformat")  # make_notebooks.py writes with it
    spec = importlib.util.spec_from_file_location("make_notebooks",
                                                  NOTEBOOKS / "make_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_generated_notebook_is_committed():
    """The notebooks on disk are exactly those make_notebooks.py writes, cell by cell."""
    nbformat = pytest.importorskip("nbformat")
    module = _generator()
    assert NAMES == sorted(module.NOTEBOOKS), "rerun python notebooks/make_notebooks.py"
    for name, build in module.NOTEBOOKS.items():
        committed = nbformat.read(NOTEBOOKS / name, as_version=4).cells
        want = build()
        assert [(c.cell_type, c.source) for c in committed] == \
            [(c.cell_type, c.source) for c in want], \
            f"{name}: rerun python notebooks/make_notebooks.py --execute {name}"


def test_notebooks_are_committed_with_their_outputs():
    nbformat = pytest.importorskip("nbformat")
    for name in NAMES:
        nb = nbformat.read(NOTEBOOKS / name, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        missing = [i for i, c in enumerate(code) if c.get("execution_count") is None]
        assert not missing, f"{name}: code cells {missing} were not run; rerun " \
                            "python notebooks/make_notebooks.py --execute"
        counts = [c.execution_count for c in code]
        assert counts == list(range(1, len(code) + 1)), f"{name}: not run top to bottom"
        errors = [o for c in code for o in c.get("outputs", [])
                  if o.get("output_type") == "error"]
        assert not errors, f"{name}: stored outputs hold an error"
        assert any(c.get("outputs") for c in code), f"{name}: no stored output"


PLOTLY = "application/vnd.plotly.v1+json"


def test_every_figure_is_committed_with_a_png():
    """Each stored plotly figure carries a PNG in the same output bundle (its static
    image, which GitHub and nbviewer show: they run no plotly.js), and no output loads
    plotly.js instead of it."""
    nbformat = pytest.importorskip("nbformat")
    for name in NAMES:
        nb = nbformat.read(NOTEBOOKS / name, as_version=4)
        outputs = [(i, o) for i, c in enumerate(nb.cells) if c.cell_type == "code"
                   for o in c.get("outputs", [])]
        figures = [(i, o.data) for i, o in outputs if PLOTLY in o.get("data", {})]
        missing = [i for i, data in figures if "image/png" not in data]
        assert not missing, f"{name}: figures of cells {missing} have no PNG; rerun " \
                            "python notebooks/make_notebooks.py --execute (needs Chromium)"
        for i, data in figures:
            assert data["image/png"].strip(), f"{name}: cell {i} has an empty PNG"
        loaders = [i for i, o in outputs if "cdn.plot.ly" in str(o.get("data", {}))]
        assert not loaders, f"{name}: cells {loaders} load plotly.js instead of a PNG"


def test_every_notebook_ends_with_what_we_found():
    """The last cell of every notebook is a markdown summary headed "What we found"."""
    nbformat = pytest.importorskip("nbformat")
    for name in NAMES:
        last = nbformat.read(NOTEBOOKS / name, as_version=4).cells[-1]
        assert last.cell_type == "markdown", f"{name}: the last cell is not markdown"
        assert last.source.startswith("## What we found"), \
            f"{name}: the last cell does not start with '## What we found'"


@pytest.mark.notebooks
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs(name, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from locos_tl.organisms import DEFAULT_ORGANISM

    if not (Path(DEFAULT_ORGANISM) / "config.json").exists():
        pytest.fail(f"the shipped organism is missing: {DEFAULT_ORGANISM}")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    try:
        client.execute()  # raises CellExecutionError with the failing cell's traceback
    finally:
        nbformat.write(nb, tmp_path / name)  # executed copy, for inspection on failure
