"""Code shared by the notebooks' first cells."""

SETUP = '''\
import os
from pathlib import Path

import locos_tl
from locos_tl import plot
from locos_tl.organisms import DEFAULT_ORGANISM, default_book_dir, make_trials

# The default organism, retrieval-long (3 layers x 8 heads, valid on prompts of 512-2048
# tokens). To use another, point LOCOS_ORGANISM at it and set N_TOKENS to its valid range
# (retrieval-2l: 64-128 tokens; each organism's MODEL_CARD.md gives it).
ORGANISM = os.environ.get("LOCOS_ORGANISM", DEFAULT_ORGANISM)
N_TOKENS = 512  # prompt length in tokens
# Public-domain novels shipped with locos_tl (locos_tl/data/books) as filler text.
book = default_book_dir()
print("filler:", sorted(p.name for p in book.glob("*.txt")))

model = locos_tl.load_model(ORGANISM, device="cpu")
cfg = model.cfg
print(f"{Path(ORGANISM).name}: {cfg.n_layers} layers x {cfg.n_heads} heads "
      f"({cfg.n_key_value_heads} kv heads), vocabulary {cfg.d_vocab}; prompts of "
      f"{N_TOKENS} tokens")'''

GROUND_TRUTH = '''\
import json

gt_path = Path(ORGANISM) / "ground_truth.json"
gt = json.loads(gt_path.read_text()) if gt_path.exists() else {}
roles = {role: [tuple(h) for h in gt.get(role, [])]
         for role in ("literal_copy", "nonliteral_writer", "prev_token")}
roles'''

FIGURES = '''\
# Each figure is stored twice in one output: interactive (plotly, for Jupyter and VS Code)
# and as a static PNG (for GitHub and nbviewer), drawn by the headless Chromium that
# docs/scripts/render_figures.py uses for the docs' figures. Without a Chromium, figures
# are interactive only.
import sys
from pathlib import Path

import plotly.graph_objects as go
from IPython import get_ipython

sys.path.insert(0, str(Path("../docs/scripts").resolve()))
_png_failed = False


def show(fig: go.Figure) -> None:
    """Display ``fig`` as one output holding its plotly JSON and a PNG of it."""
    import os
    import tempfile
    from base64 import b64encode
    from concurrent.futures import ThreadPoolExecutor

    import plotly.io as pio
    from IPython.display import display
    from render_figures import save_png

    global _png_failed
    png, said = None, "not tried"
    if not _png_failed:
        w, h = fig.layout.width or 900, fig.layout.height or 500
        with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(1) as pool:
            path = Path(tmp) / "figure.png"  # another thread: Playwright's sync API
            said = pool.submit(save_png, go.Figure(fig), path, w, h).result()  # won't
            png = path.read_bytes() if path.exists() else None  # run in the kernel's loop
    if png is None:
        if os.environ.get("LOCOS_REQUIRE_BROWSER") == "1":
            raise RuntimeError(said)
        if not _png_failed:
            print("figures are interactive only here:", said)
        _png_failed = True
        pio.show(fig)
        return
    bundle = pio.renderers["plotly_mimetype"].to_mimebundle(fig.to_dict())
    bundle["image/png"] = b64encode(png).decode()
    bundle["text/plain"] = f"<plotly figure: {fig.layout.title.text or 'untitled'}>"
    display(bundle, raw=True)


# a figure as a cell's last expression goes through show()
get_ipython().display_formatter.ipython_display_formatter.for_type(go.Figure, show)'''
