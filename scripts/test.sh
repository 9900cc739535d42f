#!/usr/bin/env bash
# The full test run (what CI runs after scripts/setup.sh): ruff, the unit, integration and
# browser tests, the notebooks executed top to bottom, the docs build in strict mode, and
# the built wheel on its own (scripts/wheel_check.sh: a fresh environment, an empty folder).
# Every step runs even when an earlier one fails; the script then lists the failed steps
# and exits non-zero. Extra arguments go to the first pytest call.
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 NO_MKDOCS_2_WARNING=1

failed=()
step() {  # step NAME COMMAND...: run one step, remember it when it fails
    local name=$1
    shift
    echo "==> $name: $*"
    "$@"
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "==> $name FAILED (exit code $rc)"
        failed+=("$name (exit code $rc)")
    fi
}

step ruff .venv/bin/ruff check locos_tl tests
step pytest .venv/bin/python -m pytest "$@"
step notebooks .venv/bin/python -m pytest -m notebooks tests/test_notebooks.py
step docs .venv/bin/mkdocs build --strict --quiet --site-dir "${TMPDIR:-/tmp}/locos_tl-site"
step wheel bash scripts/wheel_check.sh

if [ "${#failed[@]}" -ne 0 ]; then
    echo "==> ${#failed[@]} of 5 steps failed:"
    printf '    %s\n' "${failed[@]}"
    exit 1
fi
echo "==> all 5 steps passed"
