"""One trainer per run: the lease on the checkpoint folder (llmpipe.train.lock), a second trainer refused
at once naming the holder, and a trainer that dies with the snakemake that started it, so a restarted
run never has two trainers and resumes to the same weights as an unkilled one."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
import yaml

from llmpipe.io import pid_running
from llmpipe.train import lock as lockmod
from tests.conftest import REPO, REPO_IGNORE, corpus_docs, write_jsonl


def test_a_second_lock_is_refused_naming_the_holder(tmp_path):
    first = lockmod.TrainerLock(tmp_path)
    first.acquire()
    held = json.loads((tmp_path / lockmod.LOCK_NAME).read_text())
    assert (held["host"], held["pid"]) == (socket.gethostname(), os.getpid())
    other = subprocess.run(
        [sys.executable, "-c", f"from llmpipe.train.lock import TrainerLock; TrainerLock({str(tmp_path)!r}).acquire()"],
        capture_output=True,
        text=True,
    )
    assert other.returncode != 0 and f"pid {os.getpid()} on host {socket.gethostname()}" in other.stderr
    first.release()
    assert not (tmp_path / lockmod.LOCK_NAME).exists()


def test_a_dead_holder_is_taken_over(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    now = time.time()
    path = tmp_path / lockmod.LOCK_NAME
    path.write_text(json.dumps({"host": socket.gethostname(), "pid": int(gone.stdout), "heartbeat": now}))
    lockmod.TrainerLock(tmp_path).acquire()  # same host, pid no longer runs: at once
    assert json.loads(path.read_text())["pid"] == os.getpid()
    path.write_text(json.dumps({"host": "another-node", "pid": 1, "heartbeat": now - lockmod.LEASE - 1}))
    lockmod.TrainerLock(tmp_path).acquire()  # another node, heartbeat older than the lease
    path.write_text(json.dumps({"host": "another-node", "pid": 1, "heartbeat": now}))
    with pytest.raises(lockmod.LockHeld, match="pid 1 on host another-node"):
        lockmod.TrainerLock(tmp_path).acquire()


def test_a_failed_first_write_leaves_no_lock_and_an_old_empty_one_is_taken_over(tmp_path, monkeypatch):
    """The lock appears whole or not at all (a full disk while writing it left an empty file, which every later
    trainer read as "being written" and refused for ever); an empty one older than the lease is taken over."""
    path = tmp_path / lockmod.LOCK_NAME

    class DiskFull:  # the record cannot be written
        loads = staticmethod(json.loads)

        @staticmethod
        def dumps(*args, **kwargs):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(lockmod, "json", DiskFull)
    with pytest.raises(OSError, match="No space left"):
        lockmod.TrainerLock(tmp_path).acquire()
    monkeypatch.setattr(lockmod, "json", json)
    assert list(tmp_path.iterdir()) == []
    path.write_text("")
    old = time.time() - lockmod.LEASE - 1
    os.utime(path, (old, old))
    lockmod.TrainerLock(tmp_path).acquire()
    assert json.loads(path.read_text())["pid"] == os.getpid()


def test_second_launch_on_the_same_checkpoints_refuses_at_once(tmp_path):
    launch = [sys.executable, "-m", "llmpipe", "launch", "--launcher", "local", "--lock", str(tmp_path), "--"]
    first = subprocess.Popen([*launch, "-c", "import time; time.sleep(60)"], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 30
        while not (tmp_path / lockmod.LOCK_NAME).exists() and time.time() < deadline:
            time.sleep(0.1)
        second = subprocess.run([*launch, "-c", "print('trained')"], capture_output=True, text=True, timeout=60)
        assert second.returncode != 0 and "trained" not in second.stdout
        assert f"pid {first.pid} on host {socket.gethostname()}" in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(30)
    assert not (tmp_path / lockmod.LOCK_NAME).exists()  # released on the way out


TRAIN_UNDER_LEASE = (
    "import sys\nfrom llmpipe.train.lock import trainer_lease\nwith trainer_lease(sys.argv[1], 't'):\n    print('trained')"
)


def test_launch_passes_its_lease_on_and_the_trainer_does_not_take_it_again(tmp_path):
    """Under llmpipe launch --lock the trainer's own lease is the launcher's: not refused by it."""
    launch = [sys.executable, "-m", "llmpipe", "launch", "--launcher", "local", "--lock", str(tmp_path), "--"]
    done = subprocess.run([*launch, "-c", TRAIN_UNDER_LEASE, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "trained", done.stderr
    assert not (tmp_path / lockmod.LOCK_NAME).exists()


@pytest.mark.parametrize("cli", ["torch-train", "colossal-train"])
def test_a_trainer_run_by_hand_takes_the_lease_before_reading_anything(tmp_path, cli):
    """Not under llmpipe launch (by hand, torchrun, colossalai run): the trainer refuses checkpoints another
    trainer holds, naming it, before it reads its config (which does not exist here)."""
    held = lockmod.TrainerLock(tmp_path / "ckpt")
    held.acquire()
    try:
        argv = ["--config", str(tmp_path / "missing.yaml"), "--init", "i", "--data", "d", "--metrics", "m", "--out", "o"]
        env = {k: v for k, v in os.environ.items() if k not in (lockmod.HELD_ENV, "RANK")}
        other = subprocess.run(
            [sys.executable, "-m", "llmpipe", cli, *argv, "--checkpoints", str(tmp_path / "ckpt")],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert other.returncode != 0 and f"llmpipe {cli}: " in other.stderr
        assert f"pid {os.getpid()} on host {socket.gethostname()}" in other.stderr, other.stderr
    finally:
        held.release()


def test_trainer_lease_is_rank_0s_and_released_on_the_way_out(tmp_path, monkeypatch):
    monkeypatch.delenv(lockmod.HELD_ENV, raising=False)
    monkeypatch.setenv("RANK", "1")
    with lockmod.trainer_lease(tmp_path, "t"):
        assert not (tmp_path / lockmod.LOCK_NAME).exists()  # rank 0 holds it for the run
    monkeypatch.setenv("RANK", "0")
    with lockmod.trainer_lease(tmp_path / "ck", "t"):
        assert lockmod._read(tmp_path / "ck" / lockmod.LOCK_NAME)["pid"] == os.getpid()
    assert not (tmp_path / "ck").exists()  # made for the lease and empty: gone
    with lockmod.trainer_lease(tmp_path, "t"):
        (tmp_path / "step_1").mkdir()
    assert [p.name for p in tmp_path.iterdir()] == ["step_1"]  # the lock gone, a folder that was there kept


def test_a_lost_lease_stops_a_trainer_run_by_hand(tmp_path):
    """Another trainer took the lease (this one's heartbeat stalled past LEASE): this one gets SIGTERM, as
    llmpipe launch would send it."""
    code = f"import time\nfrom llmpipe.train import lock\nlock.HEARTBEAT = 0.2\n{TRAIN_UNDER_LEASE}\n    time.sleep(60)"
    env = {k: v for k, v in os.environ.items() if k not in (lockmod.HELD_ENV, "RANK")}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout.readline().strip() == "trained"
        (tmp_path / lockmod.LOCK_NAME).write_text(json.dumps({"host": "another-node", "pid": 1, "heartbeat": time.time()}))
        assert proc.wait(30) == -signal.SIGTERM
        assert "lost the trainer lock" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert json.loads((tmp_path / lockmod.LOCK_NAME).read_text())["host"] == "another-node"  # the new holder's, kept


def trainers(root) -> list[psutil.Process]:
    """The torch-train processes running in `root` (the launcher itself left out)."""
    out = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "torch-train" in cmd and "llmpipe launch" not in cmd and p.info["cwd"] == str(root):
            out.append(p)
    return out


@pytest.mark.slow
def test_kill_9_of_snakemake_stops_its_trainer_and_the_rerun_resumes_exactly(tmp_path):
    work = tmp_path / "repo"
    steps_total = 400  # the kill comes after 40 steps
    shutil.copytree(REPO, work, ignore=REPO_IGNORE, symlinks=True)
    write_jsonl(work / "corpus.jsonl", corpus_docs(80))
    cfg = {
        "data": {"sources": ["corpus.jsonl"], "num_shards": 1, "val_fraction": 0.1},
        "tokenizer": {"vocab_size": 400},
        "model": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2},
        "train": {
            "seq_len": 64,
            "global_batch_size": 8,
            "micro_batch_size": 4,
            "max_steps": steps_total,
            "warmup_steps": 5,
            "save_interval": 20,
            "eval_interval": steps_total,
            "log_interval": 1,
            "threads": 1,
        },
    }
    (work / "c.yaml").write_text(yaml.safe_dump(cfg))

    def snakemake(run, *extra, **kw):
        cmd = [
            sys.executable,
            "-m",
            "snakemake",
            f"results/{run}/checkpoints/torch/final",
            "--cores",
            "2",
            "--configfile",
            "c.yaml",
            "--config",
            f"run={run}",
            *extra,
        ]
        return subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)

    whole = snakemake("whole")
    assert whole.wait(600) == 0, whole.stdout.read()[-3000:]
    metrics = work / "results/killed/train/metrics.jsonl"
    driver = snakemake("killed")
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 40):
        time.sleep(0.05)
    running = trainers(work)
    assert running, "training did not start"
    for p in running:  # held until its launcher has had time to see snakemake die (it checks each second)
        p.suspend()
    driver.send_signal(signal.SIGKILL)  # only snakemake: its shell, launcher and trainer are left behind
    driver.wait()
    time.sleep(3)
    for p in running:  # the launcher's SIGTERM, sent while it was stopped, is handled first
        with contextlib.suppress(psutil.NoSuchProcess):
            p.resume()
    deadline = time.time() + 60
    while trainers(work) and time.time() < deadline:
        time.sleep(0.5)
    assert not trainers(work), "the trainer outlived its snakemake"
    steps_before = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if '"loss"' in line]
    assert steps_before and max(steps_before) < steps_total

    assert (
        subprocess.run(
            [sys.executable, "-m", "snakemake", "--unlock", "--cores", "1", "--configfile", "c.yaml"],
            cwd=work,
            capture_output=True,
        ).returncode
        == 0
    )
    again = snakemake("killed", "--rerun-incomplete")
    out, _ = again.communicate(timeout=600)
    assert again.returncode == 0, out[-3000:]
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if '"loss"' in line]
    assert steps == sorted(set(steps)) and steps[-1] == steps_total, "a step logged twice or missing"
    final = {run: (work / f"results/{run}/checkpoints/torch/final/model.safetensors").read_bytes() for run in ("whole", "killed")}
    assert final["whole"] == final["killed"]


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_kill_9_of_the_launcher_stops_its_trainer_and_the_lease_holds_while_it_runs(tmp_path):
    """The trainer runs in its own session (so the launcher can stop it gracefully): a launcher killed with
    SIGKILL (its snakemake's process group killed) used to leave it training, and a rerun took the lease of
    the dead launcher and trained beside it. Now the kernel sends it SIGTERM, and until its process group
    is gone the lease is not taken over on its host."""
    trainer, flags = tmp_path / "trainer.py", tmp_path / "flags"
    flags.mkdir()
    trainer.write_text(  # a trainer saving on SIGTERM, held in its handler until the test releases it
        "import pathlib, signal, sys, time\n"
        "flags = pathlib.Path(sys.argv[1])\n"
        "def stop(*a):\n"
        "    (flags / 'term').touch()\n"
        "    end = time.time() + 60\n"
        "    while not (flags / 'release').exists() and time.time() < end: time.sleep(0.05)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "(flags / 'ready').touch()\n"
        "while True: time.sleep(0.1)\n"
    )
    launch = [sys.executable, "-m", "llmpipe", "launch", "--launcher", "local", "--lock", str(tmp_path), "--"]
    first = subprocess.Popen([*launch, str(trainer), str(flags)], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (flags / "ready").exists() and time.time() < deadline:  # its SIGTERM handler is in place
        time.sleep(0.05)
    assert (flags / "ready").exists(), "the trainer never started"
    group = lockmod._read(tmp_path / lockmod.LOCK_NAME)["group"]
    assert pid_running(group, group=True)
    first.kill()
    first.wait(10)
    deadline = time.time() + 10
    while not (flags / "term").exists() and time.time() < deadline:
        time.sleep(0.05)
    assert (flags / "term").exists(), "the trainer got no SIGTERM when its launcher was killed"
    second = subprocess.run([*launch, "-c", "print('trained')"], capture_output=True, text=True, timeout=60)
    assert second.returncode != 0 and "trained" not in second.stdout  # the killed launcher's trainer still stops
    assert f"its trainer process group {group}" in second.stderr, second.stderr
    (flags / "release").touch()
    deadline = time.time() + 20
    while pid_running(group, group=True) and time.time() < deadline:
        time.sleep(0.1)
    assert not pid_running(group, group=True), "the trainer outlived its launcher"
    third = subprocess.run([*launch, "-c", "print('trained')"], capture_output=True, text=True, timeout=60)
    assert third.returncode == 0 and "trained" in third.stdout, third.stderr


def test_a_sagemaker_job_takes_no_lease_file_into_its_synced_checkpoints(tmp_path, monkeypatch):
    """SageMaker syncs checkpoints/ to S3: its entry tells the trainer the job is the lease."""
    from llmpipe.backends.sagemaker import entry

    (tmp_path / "input" / "config").mkdir(parents=True)
    (tmp_path / "input" / "config" / "hyperparameters.json").write_text(
        json.dumps({"llmpipe_config": "{}", "processes_per_instance": "1"})
    )
    seen = {}
    monkeypatch.setenv("LLMPIPE_SM_ROOT", str(tmp_path))
    monkeypatch.setattr(entry, "check_image", lambda: None)
    monkeypatch.setattr(entry, "run_teed", lambda cmd, env: seen.update(env))
    entry.main()
    assert seen[lockmod.HELD_ENV] == str((tmp_path / "checkpoints").resolve())
