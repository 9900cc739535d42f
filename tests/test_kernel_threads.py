"""In a Jupyter kernel, ``import locos_tl`` before torch shortens OpenMP's spin-wait
(``GOMP_SPINCOUNT``); a script, a user's own setting or an earlier torch import is left
alone. The speed it buys is measured by ``benchmarks/bench_kernel_busy.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _spin(pre: str, env: dict[str, str] | None = None) -> str:
    code = (f"import os, sys, types\n{pre}\nimport locos_tl\n"
            "print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))")
    base = {k: v for k, v in os.environ.items()
            if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**base, "PYTHONPATH": str(REPO), **(env or {})}, check=True)
    return out.stdout.strip()


KERNEL = "sys.modules['ipykernel'] = types.ModuleType('ipykernel')"


@pytest.mark.parametrize(("pre", "env", "want"), [
    (KERNEL, None, "3000 None"),                                # a kernel: shorter spin
    ("", None, "None None"),                                    # a script: untouched
    (KERNEL + "\nimport torch", None, "None None"),             # too late: torch loaded
    (KERNEL, {"GOMP_SPINCOUNT": "7"}, "7 None"),                # the user's setting wins
    (KERNEL, {"OMP_WAIT_POLICY": "ACTIVE"}, "None ACTIVE"),
])
def test_spin_wait_is_shortened_in_a_kernel_only(pre, env, want):
    assert _spin(pre, env) == want
