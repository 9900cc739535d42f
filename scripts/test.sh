#!/usr/bin/env bash
# The full test run (what CI runs after scripts/setup.sh): unit, integration and
# browser tests, then the five notebooks executed top to bottom, then the docs build
# in strict mode. Extra arguments go to the first pytest call.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 NO_MKDOCS_2_WARNING=1
.venv/bin/ruff check locos_tl tests
.venv/bin/python -m pytest "$@"
.venv/bin/python -m pytest -m notebooks tests/test_notebooks.py
.venv/bin/mkdocs build --strict --quiet --site-dir "${TMPDIR:-/tmp}/locos_tl-site"
