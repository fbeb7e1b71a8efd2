"""kill -9 during training (real trainer processes, tiny model): the rerun resumes from the newest
complete checkpoint and its final weights equal an uninterrupted run's, bitwise; a checkpoint being
written when the process dies is never taken as complete.

Kill points are chosen by seeded RNGs: among every instrumented moment of the run
(tests/_killpoint.py: before/after each checkpoint file write, atomic rename, old-checkpoint
removal, metrics line, mid-step), among the checkpoint-writing moments only, and once as a real
`kill -9` from outside after a seeded number of logged steps.
"""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from llmpipe.train import checkpoint as ckpt
from llmpipe.train.lock import LOCK_NAME
from tests.conftest import REPO, merge, torch_train_args

pytestmark = pytest.mark.slow

OVER = {"train": {"save_interval": 2, "keep_checkpoints": 2}}


def train_cmd(prepared, cfg, out):
    return torch_train_args(cfg, prepared["init"], prepared["view"], out / "ckpt", out / "metrics.jsonl", out / "final")


def run(cmd, **kw):
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=REPO, **kw)


def killpoint(prepared, cfg, out, n):
    return run(
        [
            sys.executable,
            str(REPO / "tests" / "_killpoint.py"),
            str(out / "events.json"),
            str(n),
            "--",
            *train_cmd(prepared, cfg, out),
        ]
    )


@pytest.fixture(scope="module")
def setup(prepared, tmp_path_factory):
    """An uninterrupted run that also lists its instrumented events."""
    cfg = merge(prepared["cfg"], OVER)
    out = tmp_path_factory.mktemp("uninterrupted")
    proc = killpoint(prepared, cfg, out, 0)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = json.loads((out / "events.json").read_text())
    return {"cfg": cfg, "out": out, "events": events}


def weights(out):
    return load_file(str(out / "final" / "model.safetensors"))


def check_after_kill(out, setup):
    """Every checkpoint that looks complete loads whole; return the newest complete step (0 if none)."""
    root = out / "ckpt"
    steps = ckpt.complete_steps(root)
    for p in root.iterdir() if root.exists() else []:  # a step_* name is only ever a complete checkpoint
        if p.name == LOCK_NAME:  # the killed trainer's lease (run by hand): the rerun takes it over, its pid gone
            continue
        assert ckpt.STEP_RE.match(p.name) and int(p.name[5:]) in steps or re.match(r"^\.step_\d{8}\.tmp-\d+$", p.name), p
    for step in steps:
        path = ckpt.step_dir(root, step)
        assert set(os.listdir(path)) == {
            "model.safetensors",
            "config.json",  # a step is a model folder too (llmpipe export takes it)
            "optimizer.pt",
            "scheduler.pt",
            "rng.pt",
            "trainer_state.json",
            "checksums.json",
            "done",
        }
        assert ckpt.damaged(path) == []  # sealed: every file matches its recorded sha256
        load_file(str(path / "model.safetensors"))
        assert json.loads((path / "config.json").read_text())["model_type"] == "llama"
        for name in ("optimizer.pt", "scheduler.pt", "rng.pt"):
            torch.load(path / name, weights_only=True)
        assert json.loads((path / "trainer_state.json").read_text())["step"] == step
    return steps[-1] if steps else 0


def resume_and_compare(prepared, setup, out, newest):
    proc = run([sys.executable, "-m", "llmpipe", *train_cmd(prepared, setup["cfg"], out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    if newest:
        assert f"(step {newest})" in proc.stderr and "resumed from" in proc.stderr
    else:
        assert "resumed from" not in proc.stderr
    a, b = weights(setup["out"]), weights(out)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, setup["cfg"]["train"]["max_steps"] + 1))
    assert not [p.name for p in (out / "ckpt").iterdir() if ".tmp-" in p.name]  # the killed writer's leftovers went


@pytest.mark.parametrize("seed,where", [(0, "any"), (1, "any"), (2, "checkpoint")])
def test_kill_at_seeded_event_then_resume_is_bitwise(prepared, setup, tmp_path, seed, where):
    events = setup["events"]
    # "checkpoint": while a checkpoint's files are being written, with an older complete one before it
    choices = [
        i + 1
        for i, e in enumerate(events)
        if where == "any" or e.startswith(("torch.save", "save_model")) and events[:i].count("step:after") > 2
    ]
    n = random.Random(seed).choice(choices)
    proc = killpoint(prepared, setup["cfg"], tmp_path, n)
    assert proc.returncode == -signal.SIGKILL, (n, events[n - 1], proc.stderr[-2000:])
    newest = check_after_kill(tmp_path, setup)
    if events[n - 1].startswith(("torch.save", "save_model")):  # killed while writing a checkpoint's files
        assert [p for p in (tmp_path / "ckpt").iterdir() if ".tmp-" in p.name]
    resume_and_compare(prepared, setup, tmp_path, newest)


def test_external_kill_9_then_resume_is_bitwise(prepared, setup, tmp_path):
    """A real `kill -9` from outside once the run has logged a seeded number of steps."""
    after = random.Random(3).randint(1, setup["cfg"]["train"]["max_steps"] - 2)
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmpipe", *train_cmd(prepared, setup["cfg"], tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=REPO,
    )
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= after:
            break
        time.sleep(0.002)
    assert proc.poll() is None, f"the run ended before the kill after {after} steps"
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert not (tmp_path / "final").exists()
    newest = check_after_kill(tmp_path, setup)
    resume_and_compare(prepared, setup, tmp_path, newest)
