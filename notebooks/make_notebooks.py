"""Write the example notebooks from the cell sources in ``cells_*.py``, and run them.

Edit the cells there, then run ``python notebooks/make_notebooks.py --execute``: the
``.ipynb`` files are generated and executed top to bottom, and committed with their
outputs (tables; each figure as plotly's JSON, interactive in Jupyter and VS Code, and a
PNG of it in the same output, which GitHub and nbviewer show). The PNGs come from the
headless Chromium of ``docs/scripts/render_figures.py`` (each notebook's ``show`` cell,
``cells_shared.FIGURES``); executing here requires it (``LOCOS_REQUIRE_BROWSER=1``, so
no notebook is written without its PNGs), a reader's Jupyter does not.
``pytest -m notebooks`` executes every
``notebooks/NN_*.ipynb`` again (``tests/test_notebooks.py``).

Size: each notebook runs in seconds to a minute on an idle 2-core CPU, and every step
that takes more than a few seconds shows a tqdm progress bar. A new notebook is one
more ``nbNN()`` function and one more entry in :data:`NOTEBOOKS`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import nbformat
from nbformat.v4 import new_notebook

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the cell modules beside this file

from cells_elicited import nb06  # noqa: E402
from cells_experiments import nb03, nb04, nb05  # noqa: E402
from cells_organism import nb00, nb01, nb02  # noqa: E402


def write(name: str, cells: list) -> Path:
    for i, cell in enumerate(cells):
        cell["id"] = f"cell-{i:02d}"  # stable ids: regenerating gives no diff
    nb = new_notebook(cells=cells, metadata={
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    })
    path = HERE / name
    nbformat.write(nb, path)
    return path


#: Every notebook: file name -> the function that builds its cells.
NOTEBOOKS: dict[str, Callable[[], list]] = {
    "00_organism.ipynb": nb00,
    "01_quickstart.ipynb": nb01,
    "02_literal_vs_nonliteral.ipynb": nb02,
    "03_causal_evidence.ipynb": nb03,
    "04_kv_compression.ipynb": nb04,
    "05_real_models.ipynb": nb05,
    "06_elicited.ipynb": nb06,
}


#: plotly's renderer where a figure has no PNG (no Chromium): plotly's JSON (JupyterLab,
#: VS Code) and a small HTML loader of plotly.js from its CDN, not plotly.js itself
#: (3.5 MB a notebook)
RENDERER = "plotly_mimetype+notebook_connected"


def execute(path: Path, timeout: int = 1800) -> None:
    """Run the notebook at ``path`` top to bottom in its folder and store its outputs."""
    import os

    import nbclient

    nb = nbformat.read(path, as_version=4)
    os.environ["PLOTLY_RENDERER"] = RENDERER  # the kernel inherits it
    # a figure whose PNG cannot be drawn fails the cell instead of being stored without it
    os.environ.setdefault("LOCOS_REQUIRE_BROWSER", "1")
    nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--execute", action="store_true",
                    help="run each notebook and store its outputs (what is committed)")
    ap.add_argument("names", nargs="*", help="notebook files to write (default: all)")
    args = ap.parse_args(argv)
    for name, build in NOTEBOOKS.items():
        if args.names and name not in args.names:
            continue
        path = write(name, build())
        if args.execute:
            execute(path)
        print(path.name)  # noqa: T201


if __name__ == "__main__":
    main()
