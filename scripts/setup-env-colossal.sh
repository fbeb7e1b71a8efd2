#!/usr/bin/env bash
# Build .venvs/colossal, the interpreter the gpu-colossal profile names (colossal.python).
#   --gpu (default where nvidia-smi lists a GPU): envs/colossal-gpu.txt (torch 2.5.1 CUDA 12.4 wheels,
#         ColossalAI 0.5.0, transformers 4.51.3), as envs/colossal.yaml; nvcc comes from the system's CUDA.
#   --cpu (default elsewhere): the exact list envs/colossal-cpu.txt (torch 2.13.0 CPU) with --no-deps
#         (colossalai declares torch<=2.5.1 plus GPU-only extras it does not need on CPU); tests and CI.
# Idempotent: does nothing when the venv was built from the same list.
# Usage: scripts/setup-env-colossal.sh [--gpu|--cpu] [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
variant=cpu
nvidia-smi -L > /dev/null 2>&1 && variant=gpu
case "${1:-}" in --gpu) variant=gpu; shift ;; --cpu) variant=cpu; shift ;; esac
venv=${1:-.venvs/colossal}
lock=envs/colossal-$variant.txt
want=$(sha256sum "$lock" | cut -d' ' -f1)
stamp="$venv/.llmpipe-lock-sha256"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  echo "setup-env-colossal: $venv is up to date"
  exit 0
fi
find_links=()
[ -d /opt/wheels ] && find_links=(--find-links /opt/wheels)  # the local CPU torch wheel
python -m venv --clear "$venv"
if [ "$variant" = gpu ]; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$lock" ninja==1.13.2
else
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "${find_links[@]}" -r "$lock"
fi
# Import check of what the trainer uses (fails the setup, not a later job).
PYTHONPATH=src "$venv/bin/python" -W ignore -c "
import colossalai, datasets, transformers
from colossalai.booster import Booster
from colossalai.booster.plugin import TorchDDPPlugin, HybridParallelPlugin, GeminiPlugin, LowLevelZeroPlugin
import llmpipe.backends.colossal.train
assert transformers.__version__ == '4.51.3', transformers.__version__
" > /dev/null
echo "$want" > "$stamp"
echo "setup-env-colossal: built $venv ($variant, $(grep -c '==' "$lock") packages)"
