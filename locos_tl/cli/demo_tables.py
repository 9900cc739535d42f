"""Tables and summaries both demos print (the organism demo, :mod:`locos_tl.cli.demo`,
and the real-model demo, :mod:`locos_tl.cli.demo_real`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


def ranking_table(results: dict[str, Any], roles: dict[tuple[int, int], str],
                  k: int = 5) -> pd.DataFrame:
    """Top-``k`` heads of each method side by side, with the ground-truth role.

    A head whose score is exactly 0 did not score (ties at 0 would only list heads in
    index order): its row shows ``-`` and no score.
    """
    import pandas as pd

    from locos_tl.errors import LocosError

    cols: dict[str, list[Any]] = {"rank": list(range(1, k + 1))}
    for method, hs in results.items():
        try:
            # all 0: no ranking; a model with fewer than k heads lists them all
            top = [] if hs.all_zero else hs.top_k(min(k, hs.n_layers * hs.n_heads))
        except LocosError:  # no accepted trial: nothing to rank
            top = []
        head, score, role = [], [], []
        for i in range(k):
            v = float(hs.scores[top[i]]) if i < len(top) else 0.0
            if v != 0 and v == v:  # scored (not 0, not NaN)
                head.append(f"L{top[i][0]}H{top[i][1]}")
                score.append(round(v, 3))
                # a role is shown only where the method actually found the head
                role.append(roles.get(top[i], "-") if v > 0 else "-")
            else:
                head.append("-")
                score.append(float("nan"))
                role.append("-")
        cols[f"{method} head"], cols[f"{method} score"], cols[f"{method} role"] = (
            head, score, role)
    return pd.DataFrame(cols)


def files_summary(out: Path, runs: list[str]) -> str:
    """Which files the demo wrote where, read back from ``out`` (never out of date)."""

    def files(d: Path) -> str:
        return ", ".join(sorted(p.name for p in d.iterdir() if p.is_file()))

    parts = [f"wrote {out}/: {files(out)}"]
    if runs:
        first = out / runs[0]
        parts.append(f"per run ({', '.join(f'{r}/' for r in runs)}): {files(first)}")
        methods = sorted(p.name for p in first.iterdir() if p.is_dir())
        if methods:
            parts.append(f"per run and method ({', '.join(f'<run>/{m}/' for m in methods)}): "
                         f"{files(first / methods[0])}")
    return ";\n".join(parts)
