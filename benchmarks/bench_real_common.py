"""What ``bench_real.py`` and ``bench_real_diagnose.py`` share: the model, the paths,
the warm-up length and the process-memory readers (Linux ``/proc/self``). Both import
this module; it imports neither."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"
#: prompt tokens of the warm-up run every mode makes before the measured one
WARM_TOKENS = 64


def _status(key: str) -> float:
    """``VmRSS`` / ``VmHWM`` of this process in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{key} not in /proc/self/status (this benchmark needs Linux)")


def _reset_peak() -> None:
    """Reset ``VmHWM`` to the current resident set (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
