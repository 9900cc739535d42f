"""Saving a benchmark's plotly figure: the figure's JSON or HTML, and a PNG where
headless Chromium is available (``docs/scripts/render_figures.py``)."""

from __future__ import annotations

import sys
from pathlib import Path


def save_figure(fig, stem: Path, fmt: str = "json") -> None:
    """``stem.json`` (``fmt="json"``) or ``stem.html`` (``"html"``), then ``stem.png``
    when headless Chromium renders it (the PNG is a convenience: a failure is printed)."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "html":
        fig.write_html(str(stem) + ".html", include_plotlyjs="cdn")
    else:
        fig.write_json(str(stem) + ".json")
    scripts = str(Path(__file__).resolve().parents[1] / "docs" / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    try:
        from render_figures import chromium, save_png

        if chromium():
            save_png(fig, Path(str(stem) + ".png"))
    except Exception as exc:  # noqa: BLE001 - the PNG is a convenience
        print(f"no PNG for {stem.name}: {exc}")  # noqa: T201
