#!/usr/bin/env bash
# Build .venvs/levanter: the Levanter backend's own environment (CPU JAX; --tpu: jax[tpu] on a
# TPU VM, as envs/levanter.yaml). Idempotent: a stamp of the pins skips a rebuild.
# Usage: scripts/setup-env-levanter.sh [--tpu] [VENV_DIR]   (~2 min and ~1.8 GB the first time)
set -euo pipefail
cd "$(dirname "$0")/.."
jax="jax==0.10.2"
if [ "${1:-}" = --tpu ]; then jax="jax[tpu]==0.10.2"; shift; fi  # libtpu for TPU VMs
venv=${1:-.venvs/levanter}
pins=(
  "marin-levanter==0.2.20.dev202606180959"  # the maintained successor of levanter (README)
  "$jax" "jaxlib==0.10.2"
  "packaging==25.0"      # as tested here (packaging < 26 with marin-levanter)
  "GitPython==3.2.1"     # imported by levanter.tracker, not declared by marin-levanter
  "jsonschema==4.26.0" "orjson==3.8.3"  # llmpipe's config and store readers in this env
)
stamp="$venv/.llmpipe-pins"
pins_id="${pins[*]} $(sha256sum envs/levanter-cpu.txt | cut -c1-16)"
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$pins_id" ]; then
  echo "setup-env-levanter: $venv is up to date"
  exit 0
fi
python3 -m venv "$venv"
constraints=(-c envs/levanter-cpu.txt)  # exact versions of every dependency, as tested
[ "$jax" = "jax==0.10.2" ] || constraints=()  # jax[tpu] pulls libtpu: resolve freshly on TPU VMs
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${constraints[@]}" "${pins[@]}"
"$venv/bin/python" -c "import levanter.main.train_lm, levanter.store.cache, jsonschema, orjson"
echo "$pins_id" > "$stamp"
echo "setup-env-levanter: $venv ready"
