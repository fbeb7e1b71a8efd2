"""llmpipe.launch: the command for 1 process, N local processes, and srun + torchrun per Slurm node
(pure functions; the real srun launch runs in test_slurm.py). Also the LLMPIPE_FAIL_ONCE test hook."""

import os
import subprocess
import sys

import pytest

from llmpipe import launch

ARGS = ["-m", "llmpipe", "train", "--config", '{"train": {"lr": 0.001}}']
PY = "/env/bin/python"
# `scontrol show job -o 77` on a 3-node job (abridged from a real record).
RECORD = (
    "JobId=77 JobName=x UserId=root(0) JobState=RUNNING Partition=trn1 NumNodes=3 NumCPUs=384 NumTasks=3 "
    "CPUs/Task=128 ReqB:S:C:T=0:0:*:* NodeList=trn1-st-[1-2],trn1-dy-7 BatchHost=trn1-st-1 WorkDir=/fsx/run"
)


def fake_scontrol(calls):
    def run(cmd):
        calls.append(cmd)
        if cmd[:3] == ["scontrol", "show", "job"]:
            return RECORD
        assert cmd == ["scontrol", "show", "hostnames", "trn1-st-[1-2],trn1-dy-7"], cmd
        return "trn1-st-1\ntrn1-st-2\ntrn1-dy-7\n"

    return run


def test_local_one_process_is_plain_python():
    assert launch.plan(ARGS, 1, 1, "auto", None, python=PY) == [PY, *ARGS]


def test_local_n_processes_is_torchrun_standalone():
    assert launch.plan(ARGS, 4, 1, "auto", None, python=PY) == [
        PY,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "4",
        *ARGS,
    ]


def test_allocation_read_from_scontrol_even_without_slurm_env():
    calls = []
    alloc = launch.slurm_allocation({"SLURM_JOB_ID": "77"}, run=fake_scontrol(calls))
    assert alloc == launch.Allocation("77", ["trn1-st-1", "trn1-st-2", "trn1-dy-7"], 128)
    assert calls[0] == ["scontrol", "show", "job", "-o", "77"]
    assert launch.slurm_allocation({}, run=fake_scontrol([])) is None


def test_multi_node_job_runs_one_torchrun_per_node_with_head_and_port():
    alloc = launch.Allocation("77", ["trn1-st-1", "trn1-st-2", "trn1-dy-7"], 128)
    cmd = launch.plan(ARGS, 32, 3, "auto", alloc, python=PY)
    assert cmd == [
        "srun",
        "--overlap",
        "--kill-on-bad-exit=1",
        "--nodes=3",
        "--ntasks=3",
        "--ntasks-per-node=1",
        "--cpus-per-task=128",
        PY,
        "-m",
        "llmpipe",
        "launch",
        "--node-task",
        "--nnodes",
        "3",
        "--nproc-per-node",
        "32",
        "--master",
        "trn1-st-1:29577",
        "--",
        *ARGS,
    ]
    # on each node: torchrun with this node's rank from the step's SLURM_NODEID
    node = launch.node_command(ARGS, {"SLURM_NODEID": "2"}, 3, 32, "trn1-st-1:29577", python=PY)
    assert node == [
        PY,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "3",
        "--node_rank",
        "2",
        "--nproc_per_node",
        "32",
        "--master_addr",
        "trn1-st-1",
        "--master_port",
        "29577",
        *ARGS,
    ]


def test_auto_uses_srun_when_the_job_has_several_nodes_and_srun_can_be_forced_on_one():
    two = launch.Allocation("5", ["a", "b"], None)
    assert launch.plan(ARGS, 1, 2, "auto", two, port=4000, python=PY)[:6] == [
        "srun",
        "--overlap",
        "--kill-on-bad-exit=1",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
    ]
    one = launch.Allocation("5", ["a"], 2)
    assert launch.plan(ARGS, 2, 1, "auto", one, python=PY)[0] == PY  # one node: torchrun --standalone
    forced = launch.plan(ARGS, 2, 1, "srun", one, python=PY)
    assert forced[0] == "srun" and "--master" in forced and forced[forced.index("--master") + 1] == "a:29505"
    assert launch.plan(ARGS, 2, 1, "local", two, python=PY)[0] == PY


def test_hyperpod_auto_resume_is_srun_auto_resume_even_on_one_node():
    one = launch.Allocation("5", ["a"], 2)
    cmd = launch.plan(ARGS, 2, 1, "auto", one, python=PY, auto_resume=True)
    assert cmd[:2] == ["srun", "--auto-resume=1"] and cmd.count("--auto-resume=1") == 1
    assert "--auto-resume=1" not in launch.plan(ARGS, 2, 1, "srun", one, python=PY)
    with pytest.raises(launch.LaunchError, match="needs a Slurm job"):
        launch.plan(ARGS, 2, 1, "auto", None, python=PY, auto_resume=True)
    with pytest.raises(launch.LaunchError, match="slurm_auto_resume needs srun"):
        launch.plan(ARGS, 2, 1, "local", one, python=PY, auto_resume=True)


def test_auto_resume_from_the_config_reaches_the_launch_dry_run(tmp_path):
    """train.slurm_auto_resume: true -> the train rule's launch prefix has --auto-resume, and the launch dry
    run under a Slurm job (scontrol stubbed on PATH) shows srun --auto-resume=1."""
    from tests.conftest import REPO

    over = tmp_path / "hp.yaml"
    over.write_text("train: {slurm_auto_resume: true}\n")
    dry = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "-p",
            "--profile",
            "local",
            "--configfile",
            str(over),
            "--config",
            f"results_dir={tmp_path}/r",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert (
        f"llmpipe launch --nproc-per-node 1 --nnodes 1 --launcher auto --auto-resume --lock {tmp_path}/r/default/"
        "checkpoints/torch -- -m llmpipe torch-train"
    ) in dry.stdout
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\n[ \"$2\" = job ] && echo 'JobId=9 NodeList=n1 CPUs/Task=4' || echo n1\n")
    (bin_dir / "scontrol").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "9"}
    out = subprocess.run(
        [sys.executable, "-m", "llmpipe", "launch", "--auto-resume", "--dry-run", "--", "-m", "x"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("srun --auto-resume=1 --overlap --kill-on-bad-exit=1 --nodes=1 --ntasks=1")


def test_wrong_node_count_or_no_slurm_job_is_a_clear_error():
    with pytest.raises(launch.LaunchError, match=r"has 2 node\(s\) \(a,b\) but 4 were asked for \(parallel.nnodes\)"):
        launch.plan(ARGS, 1, 4, "auto", launch.Allocation("5", ["a", "b"], None))
    with pytest.raises(launch.LaunchError, match="needs a Slurm job"):
        launch.plan(ARGS, 1, 2, "auto", None)
    with pytest.raises(launch.LaunchError, match="SLURM_NODEID"):
        launch.node_command(ARGS, {}, 2, 1, "a:1")


def test_nested_srun_drops_the_enclosing_steps_slurm_settings():
    env = {
        "SLURM_JOB_ID": "5",
        "SLURM_CONF": "/c",
        "SLURM_NTASKS": "1",
        "SLURM_CPUS_PER_TASK": "2",
        "SRUN_CPUS_PER_TASK": "2",
        "SBATCH_EXCLUSIVE": "1",
        "PATH": "/bin",
        "PYTHONPATH": "/src",
    }
    assert launch.srun_env(env) == {"SLURM_JOB_ID": "5", "SLURM_CONF": "/c", "PATH": "/bin", "PYTHONPATH": "/src"}


def test_cli_dry_run_and_errors():
    env = {"PATH": "/usr/bin:/bin"}
    run = lambda *a: subprocess.run(
        [sys.executable, "-m", "llmpipe", "launch", *a], capture_output=True, text=True, timeout=60, env=env
    )
    ok = run("--nproc-per-node", "2", "--dry-run", "--", "-m", "llmpipe", "train")
    assert ok.returncode == 0 and ok.stdout.split()[1:6] == [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
    ]
    bad = run("--nnodes", "2", "--dry-run", "--", "-m", "llmpipe", "train")
    assert bad.returncode == 1 and "needs a Slurm job (SLURM_JOB_ID is not set)" in bad.stderr
    assert "give the python arguments after `--`" in run("--dry-run").stderr


def test_fail_once_hook_fails_exactly_the_named_command_once(tmp_path):
    marker = tmp_path / "m"
    env = {"PATH": "/usr/bin:/bin", "LLMPIPE_FAIL_ONCE": f"check-config:{marker}"}
    run = lambda cmd: subprocess.run(
        [sys.executable, "-m", "llmpipe", cmd, "--help"], capture_output=True, text=True, timeout=60, env=env
    )
    assert run("launch").returncode == 0 and not marker.exists()  # another command: untouched
    first = run("check-config")
    assert first.returncode == 1 and "failing once on purpose" in first.stderr and marker.exists()
    assert run("check-config").returncode == 0


def test_launch_without_scontrol(tmp_path):
    """In a Slurm job whose container lacks scontrol: one node under launcher auto runs locally; srun (or
    several nodes) says what is missing in one line, not a FileNotFoundError traceback."""
    env = {**os.environ, "SLURM_JOB_ID": "77", "PATH": str(tmp_path)}  # no scontrol on PATH
    cmd = [sys.executable, "-m", "llmpipe", "launch", "--dry-run", "--nproc-per-node", "2"]
    one = subprocess.run([*cmd, "--", "-m", "x"], capture_output=True, text=True, env=env, timeout=60)
    assert one.returncode == 0 and "torch.distributed.run --standalone --nproc_per_node 2 -m x" in one.stdout, one.stderr
    two = subprocess.run([*cmd, "--nnodes", "2", "--", "-m", "x"], capture_output=True, text=True, env=env, timeout=60)
    assert two.returncode != 0 and "Traceback" not in two.stderr
    assert "llmpipe launch: scontrol not found: needed to read this Slurm job's nodes" in two.stderr
