"""Render one PNG per ``locos_tl.plot`` figure into ``docs/img/`` with headless Chromium.

Usage (from the repository root)::

    python docs/scripts/render_figures.py            # the default organism (a few minutes)
    python docs/scripts/render_figures.py --tiny     # a tiny random model (fast, no organism)
    python docs/scripts/render_figures.py --only head_heatmap   # one figure (minutes)

Each figure is written with ``write_html`` and screenshotted by Playwright, the same
path a user's browser takes. Needs ``pip install -e ".[docs]"`` and a Chromium
(``LOCOS_CHROMIUM``, ``chromium`` / ``chromium-headless-shell`` on PATH, or
``playwright install chromium``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
IMG = ROOT / "docs" / "img"
SIZES = {  # width, height in CSS pixels
    "head_heatmap": (1000, 480),
    "layer_distribution": (1000, 420),
    "ablation_curves": (1000, 420),
    "dissociation": (760, 420),
    "rank_scatter": (700, 520),
    "phi_explorer": (1100, 600),
    "reads_vs_writes": (1100, 600),
    "compression_curves": (1000, 440),
}


def tiny_figures() -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tests"))
    from plot_data import all_figures, build

    return all_figures(build(Path(tempfile.mkdtemp(prefix="locos-fig-"))))


def organism_figures(only: set[str] | None = None) -> dict[str, Any]:
    """The figures of the notebooks (as notebook 03 computes them), on the default
    organism ``retrieval-long`` at 512 tokens (``LOCOS_ORGANISM`` and ``LOCOS_TOKENS``
    override); ``only={"head_heatmap"}`` stops after the scores (about 2 minutes)."""
    import locos_tl
    from locos_tl import plot
    from locos_tl.organisms import DEFAULT_ORGANISM, default_book_dir, make_trials

    path = os.environ.get("LOCOS_ORGANISM", DEFAULT_ORGANISM)
    n_tokens = int(os.environ.get("LOCOS_TOKENS", "512"))
    model = locos_tl.load_model(path, device="cpu")
    book = default_book_dir() if default_book_dir().is_dir() else None
    detect = make_trials("nonliteral", 32, n_tokens=n_tokens, book=book, seed=3)
    s = locos_tl.score_methods(model, detect, methods=["locos", "wu", "attention_spatial"],
                               max_new_tokens=4)
    heatmap = plot.head_heatmap([s["locos"], s["wu"], s["attention_spatial"]],
                                scale="per_map",
                                title=f"{Path(path).name}, non-literal trials, {n_tokens} "
                                      "tokens: each map divided by its own max |score|")
    if only is not None and only <= {"head_heatmap"}:
        return {"head_heatmap": heatmap}
    evals = {task: make_trials(task, 10, n_tokens=n_tokens, book=book, seed=4)
             for task in ("nonliteral", "literal")}
    calib = [t.tokens for task in ("nonliteral", "literal")
             for t in make_trials(task, 10, n_tokens, book=book, seed=5)]
    means = locos_tl.calibrate_means(model, calib)
    abl = {task: locos_tl.ablation_sweep(model, trials, {"locos": s["locos"], "wu": s["wu"]},
                                   k=[1, 2, 4], means=means, seeds=(0, 1, 2),
                                   max_new_tokens=2)
           for task, trials in evals.items()}
    ds = locos_tl.dissociation_score(abl["nonliteral"], abl["literal"],
                                     retrieval_metric="rougeL", control_metric="rougeL")
    cri = locos_tl.patch_heads(model, evals["nonliteral"][:8], max_new_tokens=4)
    t = detect[0]
    target = locos_tl.greedy_decode(model, t.tokens, max_new_tokens=1).generated[0]
    phi, pattern = locos_tl.phi_from_model(model, t.tokens, target, return_pattern=True)
    words = plot.token_labels(model.tokenizer, t.tokens)
    tgt = model.tokenizer.decode([target])
    (top,) = s["locos"].top_k(1)
    zoom = (max(0, t.needle_span[0] - 24), min(t.n_tokens, t.needle_span[1] + 24))  # needle
    non = abl["nonliteral"]
    return {
        "head_heatmap": heatmap,
        "layer_distribution": plot.layer_distribution([s["locos"], s["wu"], cri], k=4),
        "ablation_curves": plot.ablation_curves(
            non[non.metric == "rougeL"],
            title="non-literal retrieval after ablating the top-k heads"),
        "dissociation": plot.dissociation(ds, title="DS(k): non-literal drop minus literal drop"),
        "rank_scatter": plot.rank_scatter(s["locos"], cri, names=("LOCOS", "CRI")),
        "phi_explorer": plot.phi_explorer(phi, words, 0, needle_span=t.needle_span,
                                          target=tgt, window=zoom),
        "reads_vs_writes": plot.reads_vs_writes(pattern, phi, words, top,
                                                needle_span=t.needle_span, target=tgt,
                                                window=zoom),
    }


def compression_figure() -> Any:
    """Notebook 04's per-query-head compression curves on `retrieval-long` (1024 tokens)."""
    import locos_tl
    from locos_tl import plot
    from locos_tl.experiments.compress import compression_sweep
    from locos_tl.organisms import LONG_ORGANISM, default_book_dir, make_trials

    model = locos_tl.load_model(LONG_ORGANISM, device="cpu")  # its own organism
    book = default_book_dir() if default_book_dir().is_dir() else None
    detect = [t for task in ("literal", "nonliteral")
              for t in make_trials(task, 16, n_tokens=1024, book=book, seed=31)]
    s = locos_tl.score_methods(model, detect, methods=["locos", "wu", "headkv"],
                               max_new_tokens=4, progress=False)
    evals = [t for task in ("literal", "nonliteral")
             for t in make_trials(task, 20, n_tokens=1024, book=book, seed=32)]
    df = compression_sweep(model, evals, {m: s[m] for m in ("locos", "wu", "headkv")},
                           (0.02, 0.05, 0.1, 0.2, 0.5, 1.0), unit="query_head",
                           progress=False)
    return plot.compression_curves(df, title="retrieval-long, 1024 tokens: per-query-head "
                                             "KV budgets")


def chromium() -> str | None:
    if os.environ.get("LOCOS_CHROMIUM"):
        return os.environ["LOCOS_CHROMIUM"]
    for name in ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome"):
        if p := shutil.which(name):
            return p
    return None


def render(figs: dict[str, Any], out: Path = IMG) -> list[Path]:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    written = []
    # the HTML and its copy of plotly.js (~5 MB) are only the screenshot's page
    with tempfile.TemporaryDirectory(prefix="locos-html-") as tmp_dir, sync_playwright() as p:
        tmp = Path(tmp_dir)
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        for name, fig in figs.items():
            w, h = SIZES.get(name, (900, 500))
            fig.update_layout(width=w, height=h, margin={"t": max(80, fig.layout.margin.t or 0)})
            html = tmp / f"{name}.html"
            fig.write_html(html, include_plotlyjs="directory", config={"displayModeBar": False})
            page = browser.new_page(viewport={"width": w + 40, "height": h + 40},
                                    device_scale_factor=1)
            page.goto(html.as_uri())
            page.wait_for_selector(".js-plotly-plot .main-svg")
            page.wait_for_timeout(300)
            png = out / f"{name}.png"
            page.locator(".js-plotly-plot").screenshot(path=str(png))
            page.close()
            written.append(png)
        browser.close()
    return written


def save_png(fig: Any, png: Path, width: int = 900, height: int = 500) -> str:
    """Write ``fig`` as ``png``: kaleido when installed, else headless Chromium
    (:func:`render`). Returns what was written, or why no PNG was (the HTML stays the
    figure); never raises."""
    try:
        fig.write_image(str(png), width=width, height=height)
        return f"{png} (kaleido)"
    except Exception:  # noqa: BLE001 - no kaleido: the Chromium renderer
        SIZES.setdefault(png.stem, (width, height))
        try:
            render({png.stem: fig}, png.parent)
            return f"{png} (headless Chromium)"
        except Exception as exc:  # noqa: BLE001 - no exporter at all
            return f"no PNG: neither kaleido nor headless Chromium worked ({exc})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="use a tiny random model")
    ap.add_argument("--skip-compression", action="store_true",
                    help="leave compression_curves.png (the slowest figure) as it is")
    ap.add_argument("--only", default="",
                    help="comma-separated figure names to render (e.g. head_heatmap)")
    args = ap.parse_args()
    only = {n for n in args.only.split(",") if n} or None
    if args.tiny:
        figs = tiny_figures()
    else:
        figs = organism_figures(only)
        if not args.skip_compression and (only is None or "compression_curves" in only):
            figs["compression_curves"] = compression_figure()
    if only is not None:
        figs = {k: v for k, v in figs.items() if k in only}
    for p in render(figs):
        print(p.relative_to(ROOT))  # noqa: T201


if __name__ == "__main__":
    main()
