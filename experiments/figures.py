"""Saving a script's plotly figure, for ``experiments/`` and ``benchmarks/``: the
figure's JSON or HTML, and a PNG where an exporter works
(``docs/scripts/render_figures.py``)."""

from __future__ import annotations

import sys
from pathlib import Path


def save_figure(fig, stem: Path, fmt: str = "json", *, width: int = 900,
                height: int = 500) -> str:
    """``stem.json`` (``fmt="json"``) or ``stem.html`` (``"html"``), then ``stem.png``
    (kaleido when installed, else headless Chromium; the PNG is a convenience, so a
    failure is reported, not raised). Returns what was written."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "html":
        fig.write_html(str(stem) + ".html", include_plotlyjs="cdn")
    else:
        fig.write_json(str(stem) + ".json")
    scripts = str(Path(__file__).resolve().parents[1] / "docs" / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    from render_figures import save_png

    png = save_png(fig, Path(str(stem) + ".png"), width=width, height=height)
    print(png)  # noqa: T201
    return f"{stem}.{fmt}; {png}"
