#!/usr/bin/env bash
# Draw the workflow without running it: dag.svg (every job) and rulegraph.svg (one node per rule)
# with Graphviz's dot (apt-get install graphviz), plus mermaid versions (dag.mmd, rulegraph.mmd)
# that GitHub and mermaid.live render without Graphviz.
#   scripts/dag.sh [OUT_DIR] [extra snakemake args, e.g. --profile profiles/slurm-local --configfile my.yaml]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.}
shift || true
mkdir -p "$out"
snakemake --dag mermaid-js "$@" > "$out/dag.mmd"
snakemake --rulegraph mermaid-js "$@" > "$out/rulegraph.mmd"
if command -v dot > /dev/null; then
  snakemake --dag "$@" | dot -Tsvg > "$out/dag.svg"
  snakemake --rulegraph "$@" | dot -Tsvg > "$out/rulegraph.svg"
  echo "wrote $out/dag.svg $out/rulegraph.svg $out/dag.mmd $out/rulegraph.mmd"
else
  echo "wrote $out/dag.mmd $out/rulegraph.mmd (no SVG: Graphviz's dot is not installed)" >&2
fi
