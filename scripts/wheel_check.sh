#!/usr/bin/env bash
# A built wheel works on its own: build it, install it into a fresh virtual environment
# outside the repository, and from an empty folder (and an empty LOCOS_CACHE) run what a
# new user runs first: the README's quick start, `locos demo`, `locos models fetch
# smollm2-135m-nolima` and `locos reproduce --stages trials` on SmolLM2. The trial files
# must equal the published ones (docs/real_models/smollm2/trials.sha256).
# Part of scripts/test.sh; alone: bash scripts/wheel_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-python3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/locos_wheel.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export LOCOS_CACHE="$WORK/cache"

echo "--> building the wheel"
"$PY" -m pip wheel -q --no-deps -w "$WORK/dist" "$REPO"
WHEEL=$(ls "$WORK"/dist/locos_tl-*.whl)
echo "    $(basename "$WHEEL") ($(du -h "$WHEEL" | cut -f1))"

echo "--> a fresh virtual environment in $WORK/env"
"$PY" -m venv "$WORK/env"
ENV="$WORK/env/bin"
quiet() { "$@" 2> >(grep -v "^WARNING: Location" >&2); }  # this machine's pip config
quiet "$ENV/python" -m pip install -q "torch==2.13.0"
quiet "$ENV/python" -m pip install -q "${WHEEL}[gguf,elicit]"

mkdir "$WORK/empty"
cd "$WORK/empty"
"$ENV/python" - <<'PY'
import locos_tl, pathlib, sys
where = pathlib.Path(locos_tl.__file__).resolve()
assert "site-packages" in where.parts, f"imported from {where}, not the installed wheel"
print(f"    locos_tl imported from {where.parent}")
PY

echo "--> the README's quick start"
"$ENV/python" - "$REPO/README.md" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
(code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
ns = {}
exec(compile(code, "README quick start", "exec"), ns)
assert ns["scores"].top_k(2) == [(1, 0), (1, 1)], ns["scores"].top_k(2)
PY

echo "--> locos demo"
"$ENV/locos" demo --out demo > demo.log
tail -n 3 demo.log

echo "--> locos models fetch smollm2-135m-nolima"
quiet "$ENV/locos" models fetch smollm2-135m-nolima

echo "--> locos reproduce --stages trials (SmolLM2)"
"$ENV/locos" reproduce --model smollm2-135m-instruct --stages trials --eval-lengths 1000,2000 \
    --out rt > reproduce.log 2>&1 || { cat reproduce.log; exit 1; }
(cd rt/trials && sha256sum -c "$REPO/docs/real_models/smollm2/trials.sha256")
echo "--> the wheel works on its own"
