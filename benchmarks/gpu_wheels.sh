#!/usr/bin/env bash
# The wheels benchmarks/gpu_lease.sh carries to the offline GPU image (Python 3.12, torch with CUDA;
# ../shared/notes/gpu-device.md): .whl holds what llmpipe's trainer imports and the image lacks (versions
# of requirements.lock), .whlc ColossalAI 0.5.0 (an sdist: built here into a pure-Python wheel) with the
# pins of its environment (envs/colossal-cpu.txt). Both folders are ignored by git (.git/info/exclude).
set -euo pipefail
cd "$(dirname "$0")/.."
pin() { grep -i "^$2==" "$1" | sed 's/ *;.*//'; } # file, name: its pinned requirement
get() { # folder, requirement...
    local dir=$1
    shift
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux1_x86_64 \
        --platform any -d "$dir" "$@"
}
for d in .whl .whlc; do grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >>.git/info/exclude; done
rm -rf .whl .whlc
get .whl $(for n in transformers backports-zstd jsonschema jsonschema-specifications referencing rpds-py orjson platformdirs; do pin requirements.lock $n; done)
tmp=$(mktemp -d)
python3 -m pip wheel -q --no-deps -w "$tmp" "$(pin envs/colossal-cpu.txt colossalai)"
mkdir -p .whlc && mv "$tmp"/colossalai-*.whl .whlc/
get .whlc $(for n in transformers tokenizers huggingface_hub datasets fabric invoke paramiko bcrypt cryptography PyNaCl \
    cffi pycparser galore-torch peft Deprecated dill multiprocess; do pin envs/colossal-cpu.txt $n; done)
du -sh .whl .whlc
