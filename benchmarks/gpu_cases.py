"""What the GPU throughput benchmarks share: each case runs in its own `torchrun --standalone` process
(so an OOM is recorded as such and frees everything), MFU comes from the device's peak (llmpipe.devices),
one line a case; a failed case prints the failing rank's own error (torchrun's per-rank logs)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
RANK_PREFIX = re.compile(r"^\[rank\d+\]: ", re.M)  # torch prefixes a rank's uncaught traceback lines
OOM = re.compile(r"out of memory|OutOfMemoryError", re.I)
ERROR_LINES = 30  # of the failing rank's traceback, its end


def _src_on_path() -> None:
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))


def peak_for(device: str, given: float | None) -> float | None:
    if given:
        return given
    _src_on_path()
    from llmpipe.devices import peak_tflops

    return peak_tflops(device)


def rank_errors(log_dir: Path) -> list[tuple[float, str, str]]:
    """(when, rank, traceback) of each rank that raised, first first, from torchrun's --log-dir: the rank's
    error.json (a main wrapped in torch.distributed.elastic's @record), else the last traceback in its
    stderr.log."""
    found = []
    for rank_dir in log_dir.glob("*/attempt_*/*"):
        err, log = rank_dir / "error.json", rank_dir / "stderr.log"
        if err.is_file():
            msg = json.loads(err.read_text())["message"]
            text = msg["extraInfo"]["py_callstack"] if isinstance(msg, dict) else str(msg)
            found.append((err.stat().st_mtime, rank_dir.name, text))
        elif log.is_file() and "Traceback (most recent call last)" in (text := log.read_text(errors="replace")):
            text = RANK_PREFIX.sub("", text)
            found.append((log.stat().st_mtime, rank_dir.name, text[text.rindex("Traceback (most recent call last)") :]))
    return sorted(found)


def failure(log_dir: Path, output: str, timed_out: bool) -> tuple[str, str]:
    """("OOM" / "failed" / "timeout", what to show): the first failing rank's traceback (its last lines),
    else the end of torchrun's own output."""
    errors = rank_errors(log_dir)
    if errors:
        _, rank, text = errors[0]
        text = f"rank {rank}: " + "\n".join(text.rstrip().splitlines()[-ERROR_LINES:])
    else:
        text = output[-3000:].strip() or "(no output)"
    return ("timeout" if timed_out else "OOM" if OOM.search(text) else "failed"), text


def run_torchrun(cmd: list[str], env: dict, timeout: int) -> tuple[int | None, str]:
    """(exit status or None on timeout, stdout + stderr) of torchrun; on timeout SIGTERM first, which
    torchrun passes on to its workers (they run in sessions of their own)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        output = proc.communicate(timeout=timeout)[0]
        return proc.returncode, output
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            return None, proc.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            return None, proc.communicate()[0]


def launch_case(script: str, case: dict, name: str, gpus: int, timeout: int, peak_tflops: float | None) -> dict:
    """`script --case JSON --result FILE` under torchrun on `gpus` processes: its result with "mfu", or the
    case with "error" (OOM, failed, timeout) and "log_tail", the failing rank's traceback. `name` starts
    the printed line."""
    with tempfile.TemporaryDirectory() as tmp:
        res, logs = Path(tmp) / "r.json", Path(tmp) / "logs"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(gpus)]
        cmd += ["--log-dir", str(logs), "--redirects", "3"]  # each rank's stdout / stderr in a file of its own
        cmd += [script, "--case", json.dumps(case), "--result", str(res)]
        env = {**os.environ, "PYTHONPATH": f"{SRC}:{os.environ.get('PYTHONPATH', '')}"}
        status, output = run_torchrun(cmd, env, timeout)
        if status != 0 or not res.exists():
            why, text = failure(logs, output, status is None)
            print(f"{name} {why}\n{text}", flush=True)
            return {**case, "world": gpus, "error": why, "log_tail": text}
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


def timed_steps(step, batches: list, case: dict, hf_config, world: int, on_gpu: bool, **extra) -> dict:
    """Inside torchrun: `case["warmup"]` steps, then `case["steps"]` timed (all ranks in step), and the
    result: tokens/s/GPU and model TFLOP/s/GPU by the plan's arithmetic (llmpipe.plan.arithmetic)."""
    import torch
    import torch.distributed as dist

    from llmpipe.plan.arithmetic import Shape, flops_per_token, matmul_parameters, parameters

    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    for i in range(case["warmup"]):
        step(batches[i % len(batches)])
    sync()
    dist.barrier()
    start = time.perf_counter()
    for i in range(case["steps"]):
        step(batches[i % len(batches)])
    sync()
    dist.barrier()
    elapsed = time.perf_counter() - start
    shape = Shape.from_hf(hf_config.to_dict())
    n = parameters(shape)
    seq = case["seq"]
    tok_s_gpu = case["steps"] * case["micro"] * seq / elapsed
    out = {
        **case,
        "world": world,
        "parameters": n,
        **extra,
        "step_s": elapsed / case["steps"],
        "tokens_per_s_per_gpu": tok_s_gpu,
        "model_tflops_per_gpu": tok_s_gpu * flops_per_token(shape, matmul_parameters(shape, n), seq) / 1e12,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None,
        "device": torch.cuda.get_device_name() if on_gpu else "cpu",
    }
    dist.barrier()  # the group is left as it is: in_torchrun ends the process without tearing it down
    return out


def add_case_args(p) -> None:
    """The driver's options both GPU benchmarks take, and the hidden ones torchrun's processes get."""
    p.add_argument("--gpus", type=int, default=None, help="processes (default: all visible GPUs)")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--micro", type=int, default=1, help="sequences per GPU per step")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--timeout", type=int, default=1800, help="seconds per case")
    p.add_argument("--out", default=None, help="JSON results")
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)


def in_torchrun(args, run_case) -> bool:
    """Inside torchrun (--case): run the case, rank 0 writes its result, and the process ends there (never
    returns). The driver: False. No teardown of the process group: with torch 2.13, freeing a gloo group
    can deadlock (its destructor joins the group's worker thread while holding the GIL that thread waits
    for to free its last work); a --cpu-smoke case hung so in CI."""
    if not args.case:
        return False
    out = run_case(json.loads(args.case))
    if int(os.environ.get("RANK", "0")) == 0:
        Path(args.result).write_text(json.dumps(out))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_cases(script: str, named: list[tuple[str, dict]], args, gpus: int) -> list[dict]:
    """Each (printed name, case) in its own torchrun, one line a case; the results in --out (JSON), rewritten
    as each case ends."""
    _src_on_path()
    from llmpipe.io import write_json

    results = []
    for name, case in named:
        results.append(launch_case(script, case, name, gpus, args.timeout, args.peak_tflops))
        if args.out:  # after each case (atomic), so a run stopped midway keeps the finished ones
            write_json(args.out, results)
    return results
