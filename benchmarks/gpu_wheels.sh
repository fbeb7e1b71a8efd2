#!/usr/bin/env bash
# The wheels benchmarks/gpu_lease.sh carries to the offline GPU image (Python 3.12, torch with CUDA;
# ../shared/notes/gpu-device.md): .whl holds what llmpipe's trainer imports and the image lacks (versions
# of requirements.lock), .whlc ColossalAI 0.5.0 (an sdist: built here into a pure-Python wheel) with the
# pins of its environment (envs/colossal.yaml). Both folders are ignored by git (.git/info/exclude).
set -euo pipefail
cd "$(dirname "$0")/.."
pin() { grep -i "^$1==" requirements.lock | sed 's/ *;.*//'; }
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
get .whl $(for n in transformers zstandard jsonschema jsonschema-specifications referencing rpds-py orjson platformdirs; do pin $n; done)
tmp=$(mktemp -d)
python3 -m pip wheel -q --no-deps -w "$tmp" colossalai==0.5.0
mkdir -p .whlc && mv "$tmp"/colossalai-*.whl .whlc/
get .whlc transformers==4.51.3 tokenizers==0.21.4 huggingface-hub==0.36.2 datasets==4.4.1 fabric==3.2.3 \
    invoke==2.2.1 paramiko==5.1.0 bcrypt==5.0.0 cryptography==50.0.2 PyNaCl==1.6.2 cffi==2.1.1 pycparser==3.12 \
    galore-torch==1.0 peft==0.13.2 Deprecated==1.3.1 dill==0.4.0 multiprocess==0.70.18
du -sh .whl .whlc
