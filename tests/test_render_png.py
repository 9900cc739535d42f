"""``docs/scripts/render_figures.save_png``, the PNG export of the docs' figures and of
``locos reproduce``: without kaleido it screenshots the figure in headless
Chromium. Its own module: Playwright's sync API cannot start inside another sync run
(``test_browser.py`` keeps one open for its module). Needs what ``test_browser.py``
needs; skipped, or failed under ``LOCOS_REQUIRE_BROWSER=1``, without it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

def test_docs_png_export_through_chromium_leaves_no_temporary_files(tmp_path, monkeypatch):
    """``docs/scripts/render_figures.save_png`` without kaleido: a PNG of the figure's
    size from headless Chromium, and its temporary HTML and plotly.js copy removed."""
    import plotly.graph_objects as go

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "docs" / "scripts"))
    monkeypatch.delitem(sys.modules, "render_figures", raising=False)
    import render_figures

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    fig = go.Figure(go.Heatmap(z=[[1, 2], [3, 4]]), layout={"title": {"text": "t"}})

    def no_kaleido(*args, **kwargs):
        raise ValueError("kaleido is not installed")

    monkeypatch.setattr(fig, "write_image", no_kaleido)
    png = tmp_path / "out" / "figure.png"
    said = render_figures.save_png(fig, png, width=300, height=200)
    assert list(scratch.iterdir()) == []  # removed whether or not it rendered
    if said.startswith("no PNG"):
        if os.environ.get("LOCOS_REQUIRE_BROWSER") == "1":
            pytest.fail(said)
        pytest.skip(said)
    assert said == f"{png} (headless Chromium)"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (300, 200)  # the plot element at the size asked for
