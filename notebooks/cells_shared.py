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
# Public-domain novels beside the repository (../shared/data/haystack) as filler text;
# synthetic filler when they are not there.
BOOKS = default_book_dir()
book = BOOKS if BOOKS.is_dir() else None
print("filler:", BOOKS if book else "synthetic (no book text found)")

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
