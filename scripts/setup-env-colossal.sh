#!/usr/bin/env bash
# Build .venvs/colossal: the CPU variant of envs/colossal.yaml (ColossalAI 0.5.0, transformers 4.51.3,
# torch 2.13.0 CPU) from the exact list envs/colossal-cpu.txt, installed with --no-deps (colossalai
# declares torch<=2.5.1 plus GPU-only extras it does not need on CPU). Idempotent: does nothing when
# the venv was built from the same list. Usage: scripts/setup-env-colossal.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venvs/colossal}
lock=envs/colossal-cpu.txt
want=$(sha256sum "$lock" | cut -d' ' -f1)
stamp="$venv/.llmpipe-lock-sha256"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  echo "setup-env-colossal: $venv is up to date"
  exit 0
fi
find_links=()
[ -d /opt/wheels ] && find_links=(--find-links /opt/wheels)  # the local CPU torch wheel
python -m venv --clear "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "${find_links[@]}" -r "$lock"
# Import check of what the trainer uses (fails the setup, not a later job).
PYTHONPATH=src "$venv/bin/python" -W ignore -c "
import colossalai, datasets, transformers
from colossalai.booster import Booster
from colossalai.booster.plugin import TorchDDPPlugin, HybridParallelPlugin, GeminiPlugin, LowLevelZeroPlugin
import llmpipe.backends.colossal.train
assert transformers.__version__ == '4.51.3', transformers.__version__
" > /dev/null
echo "$want" > "$stamp"
echo "setup-env-colossal: built $venv ($(grep -c '==' "$lock") packages)"
