#!/usr/bin/env bash
# Create .venv and install locos_tl with every extra the tests use (CPU torch first, so
# pip never pulls a multi-GB CUDA build). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev,docs,hub,ray]"
