"""launch: start a training command as one process, N processes on this node, or one torchrun per
node of a Slurm job, and exec it (the log shows the command).

  python -m llmpipe launch [--nproc-per-node N] [--nnodes N] [--launcher auto|local|srun] [--dry-run] \\
      -- -m llmpipe torch-train --config ...

  local, 1 process       python ARGS
  local, N processes     torchrun --standalone --nproc_per_node N ARGS
  srun (Slurm job)       srun --overlap --nodes K --ntasks K --ntasks-per-node 1 [--cpus-per-task C]
                           python -m llmpipe launch --node-task ...    (one task per node), which runs
                         torchrun --nnodes K --node_rank $SLURM_NODEID --nproc_per_node N
                           --master_addr HEAD --master_port PORT ARGS
  auto                   srun when --nnodes > 1 or the Slurm job has more than one node, else local.
  --auto-resume          SageMaker HyperPod: srun --auto-resume=1 (a faulty node is replaced and the step
                         restarted, resuming from the newest checkpoint); implies srun.
  --lock DIR             one trainer per run: hold the lease on checkpoint folder DIR (llmpipe.train.lock)
                         while the command runs, as a child, which is stopped when the snakemake that
                         started this launch dies (a dropped SSH session, kill -9 of the driver).

HEAD is the first host of the job's node list (`scontrol show hostnames`), PORT 29500 + job id % 1000
unless --port. The job is read with `scontrol show job`, since Snakemake's job step drops most
SLURM_* variables. torchrun is `python -m torch.distributed.run`, so it is always this interpreter's.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

# Variables a nested srun may keep; the rest describe the enclosing step and would leak into ours.
SRUN_KEEP = {"SLURM_JOB_ID", "SLURM_JOBID", "SLURM_CONF", "SLURM_CLUSTER_NAME"}


class LaunchError(RuntimeError):
    """The requested launch does not fit the environment (no Slurm job, wrong node count)."""


@dataclass(frozen=True)
class Allocation:
    job_id: str
    hosts: list[str]
    cpus_per_task: int | None


def parse_job(text: str) -> dict[str, str]:
    """`scontrol show job -o ID` output as a dict (Key=Value tokens)."""
    fields = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    return fields


def slurm_allocation(env: Mapping[str, str], run: Callable[[list[str]], str] | None = None) -> Allocation | None:
    """The Slurm job this process runs in (None outside Slurm), asked of slurmctld."""
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id:
        return None
    run = run or (lambda cmd: subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    fields = parse_job(run(["scontrol", "show", "job", "-o", job_id]))
    if "NodeList" not in fields:
        raise LaunchError(f"`scontrol show job {job_id}` has no NodeList: {fields}")
    hosts = run(["scontrol", "show", "hostnames", fields["NodeList"]]).split()
    cpus = fields.get("CPUs/Task", "")
    return Allocation(job_id, hosts, int(cpus) if cpus.isdigit() else None)


def job_allocation(env: Mapping[str, str], launcher: str, nnodes: int) -> Allocation | None:
    """slurm_allocation, where scontrol may be missing (a container a Slurm job started): one node under
    launcher auto needs no allocation; otherwise a clear error."""
    try:
        return slurm_allocation(env)
    except FileNotFoundError as exc:
        if launcher == "auto" and nnodes == 1:
            return None
        raise LaunchError(
            f"{exc.filename or 'scontrol'} not found: needed to read this Slurm job's nodes (run where Slurm's tools are)"
        ) from None


def rdzv_port(job_id: str, port: int | None = None) -> int:
    return port if port else 29500 + int(job_id) % 1000


def local_command(args: list[str], nproc: int, python: str = sys.executable) -> list[str]:
    if nproc == 1:
        return [python, *args]
    return [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), *args]


def srun_command(
    args: list[str],
    alloc: Allocation,
    nproc: int,
    port: int | None = None,
    python: str = sys.executable,
    auto_resume: bool = False,
) -> list[str]:
    """One task per node of the job, each running `launch --node-task` (which execs torchrun)."""
    n = len(alloc.hosts)
    cmd = ["srun", "--overlap", "--kill-on-bad-exit=1", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1"]
    if auto_resume:
        cmd.insert(1, "--auto-resume=1")  # HyperPod's Slurm plugin (its recipes: srun --auto-resume=1)
    if alloc.cpus_per_task:
        cmd.append(f"--cpus-per-task={alloc.cpus_per_task}")
    return cmd + [
        python,
        "-m",
        "llmpipe",
        "launch",
        "--node-task",
        "--nnodes",
        str(n),
        "--nproc-per-node",
        str(nproc),
        "--master",
        f"{alloc.hosts[0]}:{rdzv_port(alloc.job_id, port)}",
        "--",
        *args,
    ]


def node_command(
    args: list[str], env: Mapping[str, str], nnodes: int, nproc: int, master: str, python: str = sys.executable
) -> list[str]:
    """torchrun for this node of an srun step; the node rank is the step's SLURM_NODEID."""
    if "SLURM_NODEID" not in env:
        raise LaunchError("--node-task runs inside `srun` (SLURM_NODEID is not set)")
    host, _, port = master.rpartition(":")
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nnodes),
        "--node_rank",
        env["SLURM_NODEID"],
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        host,
        "--master_port",
        port,
        *args,
    ]


def srun_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment for a nested srun: the enclosing step's SLURM_*/SRUN_*/SBATCH_* settings removed."""
    return {k: v for k, v in env.items() if k in SRUN_KEEP or not k.startswith(("SLURM_", "SRUN_", "SBATCH_"))}


def plan(
    args: list[str],
    nproc: int,
    nnodes: int,
    launcher: str,
    alloc: Allocation | None,
    port: int | None = None,
    python: str = sys.executable,
    auto_resume: bool = False,
) -> list[str]:
    """The command to exec for `launcher` (auto, local, srun) given the Slurm job (or None)."""
    if launcher not in ("auto", "local", "srun"):
        raise LaunchError(f"unknown launcher {launcher!r}: auto, local or srun")
    if auto_resume and launcher == "local":
        raise LaunchError("train.slurm_auto_resume needs srun (HyperPod's --auto-resume); train.launcher is local")
    use_srun = (
        launcher == "srun" or auto_resume or (launcher == "auto" and (nnodes > 1 or (alloc is not None and len(alloc.hosts) > 1)))
    )
    if not use_srun:
        return local_command(args, nproc, python)
    if alloc is None:
        raise LaunchError(
            f"launching on {nnodes} node(s) with srun needs a Slurm job (SLURM_JOB_ID is not set); "
            "run under a Slurm profile, or set parallel.nnodes: 1 and train.launcher: local"
        )
    if len(alloc.hosts) != nnodes:
        raise LaunchError(
            f"Slurm job {alloc.job_id} has {len(alloc.hosts)} node(s) ({','.join(alloc.hosts)}) "
            f"but {nnodes} were asked for (parallel.nnodes)"
        )
    return srun_command(args, alloc, nproc, port, python, auto_resume)


# Run argv[2:] with SIGTERM sent to it when its parent (the launcher, argv[1]) dies, even by SIGKILL
# (Linux PR_SET_PDEATHSIG, kept across exec): its own session would otherwise outlive the launcher and a
# rerun would start a second trainer beside it. Not preexec_fn: the lease's heartbeat thread runs. The
# call of io.die_with_parent, written out: this interpreter must not depend on finding llmpipe.
DIES_WITH_PARENT = (
    "import ctypes, os, signal, sys; "
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM); "
    "os.getppid() == int(sys.argv[1]) or sys.exit('llmpipe launch: the launcher is gone'); "
    "os.execvp(sys.argv[2], sys.argv[2:])"
)


def dies_with_parent(cmd: list[str]) -> list[str]:
    return [sys.executable, "-c", DIES_WITH_PARENT, str(os.getpid()), *cmd] if sys.platform == "linux" else cmd


def run_locked(cmd: list[str], env: dict, folder: str) -> int:
    """Run `cmd` holding the run's trainer lease; stop it (its whole process group) when the snakemake
    that started us dies or the lease is lost; the exit code is the command's."""
    from llmpipe.train.lock import HELD_ENV, LockHeld, TrainerLock, alive, snakemake_ancestor

    lock = TrainerLock(folder)
    try:
        lock.acquire()
    except LockHeld as exc:
        raise SystemExit(f"llmpipe launch: {exc}") from None
    env = {**env, HELD_ENV: str(lock.path.parent.resolve())}  # the trainer does not take it again
    driver = snakemake_ancestor()
    child = subprocess.Popen(dies_with_parent(cmd), env=env, start_new_session=True)
    lock.set_group(child.pid)  # its own session: the lease holds while any process of it runs
    stop = lambda signum, frame: os.killpg(child.pid, signum)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while child.poll() is None:
            if driver is not None and not alive(driver):
                print(f"llmpipe launch: snakemake (pid {driver[0]}) is gone: stopping the training", file=sys.stderr, flush=True)
                stop_group(child)
            elif lock.lost.is_set():
                print(f"llmpipe launch: lost the trainer lock {lock.path}: stopping", file=sys.stderr, flush=True)
                stop_group(child)
            time.sleep(1.0)
    finally:
        if child.poll() is None:
            stop_group(child)
        lock.release()
    return child.returncode


def stop_group(child: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM the child's process group, SIGKILL what is left after `grace` seconds."""
    try:
        os.killpg(child.pid, signal.SIGTERM)
        child.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    except ProcessLookupError:
        pass


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(prog="llmpipe launch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc-per-node", type=int, default=1)
    p.add_argument("--nnodes", type=int, default=1, help="nodes expected (parallel.nnodes); checked against the Slurm job")
    p.add_argument("--launcher", default="auto", choices=["auto", "local", "srun"])
    p.add_argument("--port", type=int, default=None, help="rendezvous port (default 29500 + job id %% 1000)")
    p.add_argument("--auto-resume", action="store_true", help="HyperPod: srun --auto-resume=1 (train.slurm_auto_resume)")
    p.add_argument("--lock", help="checkpoint folder: hold its trainer lease while the command runs (one trainer per run)")
    p.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    p.add_argument("--node-task", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--master", help=argparse.SUPPRESS)
    opts = p.parse_args(argv[:split])
    args = argv[split + 1 :]
    if not args:
        raise SystemExit("llmpipe launch: give the python arguments after `--`, e.g. -- -m llmpipe torch-train ...")
    if opts.nproc_per_node < 1 or opts.nnodes < 1:
        raise SystemExit("llmpipe launch: --nproc-per-node and --nnodes must be >= 1")
    env = dict(os.environ)
    try:
        if opts.node_task:
            cmd = node_command(args, env, opts.nnodes, opts.nproc_per_node, opts.master)
        else:
            alloc = None if opts.launcher == "local" else job_allocation(env, opts.launcher, opts.nnodes)
            cmd = plan(args, opts.nproc_per_node, opts.nnodes, opts.launcher, alloc, opts.port, auto_resume=opts.auto_resume)
            if cmd[0] == "srun":
                env = srun_env(env)
    except (LaunchError, subprocess.CalledProcessError) as exc:
        detail = f": {exc.stderr.strip()}" if isinstance(exc, subprocess.CalledProcessError) else ""
        raise SystemExit(f"llmpipe launch: {exc}{detail}") from None
    if opts.dry_run:
        print(shlex.join(cmd))
        return
    print(f"llmpipe launch: {shlex.join(cmd)}", file=sys.stderr, flush=True)
    if opts.lock and not opts.node_task:
        sys.exit(run_locked(cmd, env, opts.lock))
    os.execvpe(cmd[0], cmd, env)
