#!/usr/bin/env bash
# The Neuron environment for the neuron backend on a trn1 / trn2 node (Deep Learning AMI Neuron, or any
# Ubuntu with the Neuron driver): a venv with neuronx-distributed, torch-neuronx and neuronx-cc from
# Neuron's pip repository plus what NxD's Llama examples pin (envs/neuron.txt), and the NxD checkout
# whose example trainers run (neuron.nxd_dir). Run it on a node (or in the shared home every node sees),
# then point the config at it:
#   scripts/setup-env-neuron.sh [--dry-run] [VENV_DIR] [NXD_DIR]   (defaults .venvs/neuron, neuronx-distributed)
#   neuron: {python: .venvs/neuron/bin/python, nxd_dir: neuronx-distributed}
# --dry-run prints every command and runs none (how the tests check it: no Trainium or Neuron repo here).
set -euo pipefail
cd "$(dirname "$0")/.."
dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
venv=${1:-.venvs/neuron}
nxd=${2:-neuronx-distributed}
NXD_REPO=https://github.com/aws-neuron/neuronx-distributed
NXD_COMMIT=fbac349b61a3adbb123c2983835af692840ff62f   # "Release 2.29": the trainers llmpipe's commands target
NEURON_INDEX=https://pip.repos.neuron.amazonaws.com
run() { echo "+ $*"; if [ "$dry" = 0 ]; then "$@"; fi; }
if [ "$dry" = 0 ] && ! ls /dev/neuron0 > /dev/null 2>&1; then
  echo "setup-env-neuron: no /dev/neuron0: not a Trainium node (the Neuron driver comes with the DLAMI)" >&2
  exit 1
fi
run python3 -m venv "$venv"
run "$venv/bin/python" -m pip install -U pip
run "$venv/bin/python" -m pip install --extra-index-url "$NEURON_INDEX" -r envs/neuron.txt
if [ ! -d "$nxd/.git" ]; then
  run git clone "$NXD_REPO" "$nxd"
fi
run git -C "$nxd" checkout --detach "$NXD_COMMIT"
run "$venv/bin/python" -c "import neuronx_distributed, torch_neuronx, transformers; assert transformers.__version__ == '4.48.0'"
echo "setup-env-neuron: $venv ready; set neuron.python: $venv/bin/python and neuron.nxd_dir: $nxd"
