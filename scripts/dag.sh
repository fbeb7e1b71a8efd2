#!/usr/bin/env bash
# Draw the workflow without running it: the planning picture (llmpipe dag: one box per rule with what
# it asks the cluster for, the training rule with the plan's wall time and cost; planning-dag.svg/.png,
# drawn with matplotlib where Graphviz is missing), dag.svg (every job) and rulegraph.svg with
# Graphviz's dot (apt-get install graphviz), plus mermaid versions (dag.mmd, rulegraph.mmd).
#   scripts/dag.sh [OUT_DIR] [extra snakemake args, e.g. --profile slurm-trn1 --configfile my.yaml]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.}
shift || true
mkdir -p "$out"
python -m llmpipe dag --out "$out" -- "$@"
snakemake --dag mermaid-js "$@" > "$out/dag.mmd"
snakemake --rulegraph mermaid-js "$@" > "$out/rulegraph.mmd"
if command -v dot > /dev/null; then
  snakemake --dag "$@" | dot -Tsvg > "$out/dag.svg"
  snakemake --rulegraph "$@" | dot -Tsvg > "$out/rulegraph.svg"
  echo "wrote $out/dag.svg $out/rulegraph.svg $out/dag.mmd $out/rulegraph.mmd"
else
  echo "wrote $out/dag.mmd $out/rulegraph.mmd (no SVG: Graphviz's dot is not installed)" >&2
fi
