#!/usr/bin/env bash
# Build .venvs/nxd-hf: transformers 4.48.0 and datasets 3.6.0 (the versions NxD's Llama examples pin) and
# their dependencies from the exact list envs/nxd-hf-cpu.txt, no torch (AutoConfig needs none). Tests read our
# config.json and hf view there exactly as NxD's trainer will (tests/test_neuron_hf_config.py). Idempotent: does nothing when
# the venv was built from the same list. Usage: scripts/setup-env-nxd-hf.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venvs/nxd-hf}
lock=envs/nxd-hf-cpu.txt
want=$(sha256sum "$lock" | cut -d' ' -f1)
stamp="$venv/.llmpipe-lock-sha256"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  echo "setup-env-nxd-hf: $venv is up to date"
  exit 0
fi
python -m venv --clear "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$lock"
"$venv/bin/python" -c "import datasets, transformers; assert (transformers.__version__, datasets.__version__) == ('4.48.0', '3.6.0')"
echo "$want" > "$stamp"
echo "setup-env-nxd-hf: built $venv (transformers 4.48.0, datasets 3.6.0)"
