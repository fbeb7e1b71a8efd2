#!/usr/bin/env bash
# Regenerate requirements.lock: the exact set CI and the reproducible install use, one file for every
# Python (3.11-3.13) and platform (universal markers), from pyproject.toml's ranges + the test extra.
# Needs uv (pip install uv) and PyPI. torch's own CUDA packages (nvidia-*, cuda-*, triton) are left out:
# torch pins them exactly itself, and a CPU wheel needs none of them.
set -euo pipefail
cd "$(dirname "$0")/.."
compile() {
  uv pip compile pyproject.toml --extra test --universal --python-version 3.11 --index-url https://pypi.org/simple \
    --custom-compile-command scripts/lock.sh --quiet "$@"
}
skip=()
for name in $(compile | grep -oE '^(nvidia-[a-z0-9-]+|cuda-[a-z0-9-]+|triton)==' | tr -d '='); do
  skip+=(--no-emit-package "$name")
done
# uv keeps the versions of an existing output file where the ranges allow: start from the current lock.
[ -f requirements.lock ] && cp requirements.lock requirements.lock.tmp
compile "${skip[@]}" -o requirements.lock.tmp
mv requirements.lock.tmp requirements.lock
