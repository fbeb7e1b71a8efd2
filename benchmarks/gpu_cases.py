"""What the GPU throughput benchmarks share: each case runs in its own `torchrun --standalone` process
(so an OOM is recorded as such and frees everything), MFU comes from the device's peak, one line a case."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense BF16


def peak_for(device: str, given: float | None) -> float | None:
    if given:
        return given
    return next((v for k, v in PEAK_TFLOPS.items() if k in device), None)


def launch_case(script: str, case: dict, name: str, gpus: int, timeout: int, peak_tflops: float | None) -> dict:
    """`script --case JSON --result FILE` under torchrun on `gpus` processes: its result with "mfu", or the
    case with "error" (OOM, failed, timeout) and the log's tail. `name` starts the printed line."""
    with tempfile.TemporaryDirectory() as tmp:
        res = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(gpus)]
        cmd += [script, "--case", json.dumps(case), "--result", str(res)]
        env = {**os.environ, "PYTHONPATH": f"{SRC}:{os.environ.get('PYTHONPATH', '')}"}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
            failed, tail = proc.returncode != 0, proc.stdout[-1500:] + proc.stderr[-1500:]
        except subprocess.TimeoutExpired:
            failed, tail = True, "timeout"
        if failed or not res.exists():
            why = "OOM" if "out of memory" in tail.lower() or "OutOfMemory" in tail else "failed"
            print(f"{name} {why}", flush=True)
            return {**case, "world": gpus, "error": why, "log_tail": tail[-800:]}
        r = json.loads(res.read_text())
    peak = peak_for(r["device"], peak_tflops)
    r["mfu"] = r["model_tflops_per_gpu"] / peak if peak else None
    mfu = "-" if r["mfu"] is None else f"{r['mfu']:.1%}"
    mem = "-" if r["peak_memory_gib"] is None else f"{r['peak_memory_gib']:.1f} GiB"
    print(
        f"{name} {r['tokens_per_s_per_gpu']:>10.0f} tok/s/GPU  {r['model_tflops_per_gpu']:7.1f} TFLOP/s/GPU  "
        f"MFU {mfu}  peak {mem}  ({r['device']} x {r['world']})",
        flush=True,
    )
    return r
