#!/usr/bin/env bash
# H1's GPU measurements in one lent-GPU session (docs/benchmarks.md), on the offline GPU image
# (../shared/notes/gpu-device.md: Python 3.12, torch with CUDA, no network). Wheels the image lacks are
# carried in .whl (llmpipe's needs, transformers of requirements.lock) and .whlc (ColossalAI 0.5.0 and
# its pins), fetched by benchmarks/gpu_wheels.sh.
#
#   bash benchmarks/gpu_lease.sh torch      # torch backend: minimal loop, DDP, masking at 4096 and 8192, FSDP2
#   bash benchmarks/gpu_lease.sh colossal   # ColossalAI Gemini: 7B on one GPU, then the 1.1B
#   BUDGET=540 bash benchmarks/gpu_lease.sh short   # the torch cases by priority, then Gemini 1.1B, in BUDGET seconds
#   BUDGET=480 bash benchmarks/gpu_lease.sh loss    # the compiled loss against its eager form, and the minimal loop,
#                                                   # at 4096 micro 4, in two rounds of opposite order (no ColossalAI)
#
# Results (JSON, one file per group, rewritten after each case) and logs go to $OUT (default ./gpu-out).
# The torch phase also starts ColossalAI's kernel build (HybridAdam's CPU and CUDA kernels, 155 s on the H100 machine) in the
# background, in a process session of its own, so the colossal phase finds it done on the same machine.
set -uo pipefail
phase=${1:?loss, short, torch or colossal}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-4}
py=python3
site=/tmp/llmpipe-site
csite=/tmp/colossal-site

install() { # target, wheels folder
    [ -d "$1" ] || $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$1" "$2"/*.whl || exit 2
}

colossal_site() { # ColossalAI's pins first; bitsandbytes as a stub: imported by colossalai, unused with HybridAdam
    install "$csite" .whlc
    mkdir -p "$csite/bitsandbytes/optim" "$csite/bitsandbytes-0.50.2.dist-info"
    echo '__version__ = "0.50.2"  # a stub: measurement only, no 8-bit optimizer is used' >"$csite/bitsandbytes/__init__.py"
    : >"$csite/bitsandbytes/optim/__init__.py"
    echo 'class Optimizer2State: ...  # a stub' >"$csite/bitsandbytes/optim/optimizer.py"
    printf 'Metadata-Version: 2.1\nName: bitsandbytes\nVersion: 0.50.2\n' >"$csite/bitsandbytes-0.50.2.dist-info/METADATA"
}

build_log=/tmp/colossal-build.log # outside $OUT, which each lent-GPU call empties
start_colossal_build() { # in a process session of its own: it outlives this call on the same machine
    cat >/tmp/colossal_build.py <<'PY'
import time; t = time.time()
from colossalai.kernel.kernel_loader import CPUAdamLoader, FusedOptimizerLoader
CPUAdamLoader().load(); FusedOptimizerLoader().load()
print(f"colossal kernels built in {time.time() - t:.0f} s", flush=True)
PY
    PYTHONPATH="$csite:$site:src" setsid $py /tmp/colossal_build.py >"$build_log" 2>&1 </dev/null &
}

install "$site" .whl
export PYTHONPATH="$site:src"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv | tee -a "$OUT/device.txt"
$py -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/device.txt" || exit 3

end=$(($(date +%s) + ${BUDGET:-100000}))
left() { echo $((end - $(date +%s))); }
t() { # group name, then the torch benchmark's arguments; skipped when under a minute of BUDGET is left
    local name=$1 cap
    shift
    cap=$(($(left) - 10 < 170 ? $(left) - 10 : 170))
    [ "$cap" -ge 60 ] || { echo "== $name skipped: $(left) s of the budget left"; return; }
    echo "== $name $(date +%T)"
    $py benchmarks/torch_gpu_throughput.py --timeout "$cap" --out "$OUT/$name.json" "$@" 2>&1 | tee -a "$OUT/torch.log"
}

case $phase in
loss)
    t l4096a --modes ddp,minimal --compile on --masking off --loss auto,eager --seq 4096 --micro 4 --steps 20
    t l4096b --modes minimal,ddp --compile on --masking off --loss eager,auto --seq 4096 --micro 4 --steps 20
    echo "== done $(date +%T)"
    ;;
torch)
    (colossal_site && start_colossal_build) &
    # preflight: the trainer's pieces import and one tiny step runs on the GPU (seconds; fails fast)
    $py benchmarks/torch_gpu_throughput.py --shape tiny --seq 256 --steps 2 --warmup 1 --modes ddp --compile off \
        --masking on --timeout 120 || exit 4
    t t4096 --modes minimal,ddp --compile on --masking off,on --seq 4096 --micro 4
    t t8192 --modes ddp --compile on --masking off,on --seq 8192 --micro 2
    t t4096fsdp2 --modes fsdp2 --compile on --masking off --seq 4096 --micro 4
    echo "== done $(date +%T)"
    ;;
short) # one short lease (15 minutes of device time, start-up included): the issue's figures by priority
    (colossal_site && MAX_JOBS=8 start_colossal_build) &
    t s4096 --modes ddp,minimal --compile on --masking off --seq 4096 --micro 4
    t s4096mask --modes ddp --compile on --masking on --seq 4096 --micro 4
    t s8192 --modes ddp --compile on --masking off,on --seq 8192 --micro 2
    t s4096fsdp2 --modes fsdp2 --compile on --masking off --seq 4096 --micro 4
    while pgrep -f colossal_build.py >/dev/null && [ "$(left)" -gt 100 ]; do sleep 2; done
    cp "$build_log" "$OUT/" 2>/dev/null
    if grep -q "kernels built" "$build_log" 2>/dev/null && [ "$(left)" -gt 100 ]; then
        echo "== c1b $(date +%T)"
        PYTHONPATH="$csite:$site:src" $py benchmarks/colossal_gpu_throughput.py --shapes 1b --plugins gemini --micro 4 \
            --steps 8 --warmup 3 --timeout $(($(left) - 10)) --out "$OUT/c1b.json" 2>&1 | tee -a "$OUT/colossal.log"
    else
        echo "== c1b skipped: $(left) s left; kernel build: $(tail -3 "$build_log" 2>/dev/null)"
    fi
    echo "== done $(date +%T)"
    ;;
colossal)
    colossal_site
    [ -f "$build_log" ] || start_colossal_build
    while pgrep -f colossal_build.py >/dev/null; do sleep 2; done # the torch phase's build, if still running
    cp "$build_log" "$OUT/"
    grep "kernels built" "$build_log" || { tail -20 "$build_log"; exit 5; }
    export PYTHONPATH="$csite:$site:src"
    echo "== c7b $(date +%T)"
    $py benchmarks/colossal_gpu_throughput.py --shapes 7b --plugins gemini --micro 1 --steps 4 --warmup 2 \
        --timeout 240 --out "$OUT/c7b.json" 2>&1 | tee -a "$OUT/colossal.log"
    echo "== c1b $(date +%T)"
    $py benchmarks/colossal_gpu_throughput.py --shapes 1b --plugins gemini --micro 4 --steps 10 --warmup 3 \
        --timeout 200 --out "$OUT/c1b.json" 2>&1 | tee -a "$OUT/colossal.log"
    echo "== done $(date +%T)"
    ;;
esac
