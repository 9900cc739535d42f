"""The README's quick start runs as written, and says what it prints."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def quick_start() -> str:
    text = README.read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the quick start is one python block"
    return blocks[0]


def test_quick_start_runs_as_written():
    code = quick_start()
    assert len(code.strip().splitlines()) <= 10
    namespace: dict = {}
    exec(compile(code, "README.md quick start", "exec"), namespace)  # noqa: S102
    scores = namespace["scores"]
    # the comment's claim: the organism's non-literal writers come first
    assert scores.top_k(2) == [(1, 0), (1, 1)]
    df = scores.to_frame()
    assert {"layer", "head", "score", "n_trials"} <= set(df.columns)


def test_readme_is_one_screen_per_section():
    assert len(README.read_text().splitlines()) <= 150
