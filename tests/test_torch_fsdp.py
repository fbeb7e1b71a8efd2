"""FSDP2 (parallel.zero 3: torch.distributed.fsdp.fully_shard) beside DDP, on CPU with gloo: 2 processes
train as 1 does (one process is not sharded: a plain module), DCP checkpoints resume after a stop to the
uninterrupted run, and on another number of processes (2 -> 1, 1 -> 2); activation checkpointing changes
nothing but memory."""

import json
import re

import pytest
import torch
from safetensors.torch import load_file

from tests.test_train_torch import losses, run_train

FSDP = {"parallel": {"zero": 3}}
# fp32: sharded reduce-scatter vs one process's local sums reorder float additions; over 12 steps the
# per-step losses agree to ~1e-6 here. 1e-4 absolute (as DDP's test) is the bound asserted.
LOSS_ATOL = 1e-4


@pytest.fixture(scope="module")
def fsdp_one(prepared, tmp_path_factory):
    """One process with zero 3, the reference run: not sharded (a plain module), DCP checkpoints."""
    out, proc = run_train(prepared, tmp_path_factory.mktemp("fsdp1"), "one", cfg_over=FSDP)
    assert "world 1 (zero 3 with 1 process: not sharded)" in proc.stderr
    assert json.loads((out / "final" / "train_summary.json").read_text())["data_parallel"] == "none (zero 3, 1 process)"
    assert (out / "ckpt" / "step_00000012" / "dcp" / ".metadata").is_file()
    return out


def test_fsdp_two_processes_match_one_and_ddp(prepared, fsdp_one, tmp_path):
    two, proc = run_train(prepared, tmp_path, "two", cfg_over=FSDP, nproc=2)
    assert "world 2 (FSDP2)" in proc.stderr and "grad accumulation 2" in proc.stderr
    # the parameters logged are the model's, not one rank's shard times the processes (a DTensor's numel is whole)
    counted = int(re.search(r"(\d+) parameters", proc.stderr).group(1))
    assert counted == sum(t.numel() for t in load_file(str(fsdp_one / "final" / "model.safetensors")).values())
    one, two_recs = losses(fsdp_one), losses(two)
    assert len(one) == len(two_recs) == 12
    for r1, r2 in zip(one, two_recs):
        assert r2["loss"] == pytest.approx(r1["loss"], abs=LOSS_ATOL), r1["step"]
        assert r2["grad_norm"] == pytest.approx(r1["grad_norm"], rel=1e-3), r1["step"]
    assert two_recs[-1]["val_loss"] == pytest.approx(one[-1]["val_loss"], abs=LOSS_ATOL)
    ddp, _ = run_train(prepared, tmp_path, "ddp", cfg_over={"train": {"max_steps": 12}})
    for r1, r2 in zip(losses(ddp), one):  # zero 3 on one process is the DDP recipe
        assert r2["loss"] == pytest.approx(r1["loss"], abs=LOSS_ATOL), r1["step"]
    # the final HF folder holds the whole weights, gathered from the shards
    a, b = load_file(str(fsdp_one / "final" / "model.safetensors")), load_file(str(two / "final" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-4, rtol=0)
    summary = json.loads((two / "final" / "train_summary.json").read_text())
    assert summary["data_parallel"] == "fsdp2" and summary["world_size"] == 2


def test_fsdp_resume_after_stop_and_on_another_world_size(prepared, fsdp_one, tmp_path):
    """Stopped after step 5 on 2 processes (DCP shards); resumed (a) on 2, (b) on 1 process: both equal the
    uninterrupted run."""
    out, _ = run_train(prepared, tmp_path, "stopped", cfg_over=FSDP, nproc=2, stop_after=5)
    step5 = out / "ckpt" / "step_00000005"
    assert (step5 / "dcp" / ".metadata").is_file() and (step5 / "done").is_file()
    assert len(list((step5 / "dcp").glob("*.distcp"))) == 2  # one file of shards per rank
    saved = tmp_path / "saved"
    import shutil

    shutil.copytree(out, saved)
    ref = losses(fsdp_one)
    for name, nproc in (("stopped", 2), ("saved", 1)):
        resumed, proc = run_train(prepared, tmp_path, name, cfg_over=FSDP, nproc=nproc)
        assert "resumed from" in proc.stderr and "(step 5)" in proc.stderr
        recs = losses(resumed)
        assert [r["step"] for r in recs] == list(range(1, 13))
        for r1, r2 in zip(ref[5:], recs[5:]):
            assert r2["loss"] == pytest.approx(r1["loss"], abs=LOSS_ATOL), (name, r1["step"])
        assert recs[-1]["val_loss"] == pytest.approx(ref[-1]["val_loss"], abs=LOSS_ATOL)


def test_one_process_checkpoint_resumes_sharded_on_two(prepared, fsdp_one, tmp_path):
    """A zero 3 run stopped after step 5 on 1 process (unsharded, one DCP file) resumes on 2 processes
    under FSDP2 to the uninterrupted run's losses and final weights."""
    out, _ = run_train(prepared, tmp_path, "one", cfg_over=FSDP, stop_after=5)
    assert len(list((out / "ckpt" / "step_00000005" / "dcp").glob("*.distcp"))) == 1
    resumed, proc = run_train(prepared, tmp_path, "one", cfg_over=FSDP, nproc=2)
    assert "world 2 (FSDP2)" in proc.stderr and "(step 5)" in proc.stderr
    recs, ref = losses(resumed), losses(fsdp_one)
    assert [r["step"] for r in recs] == list(range(1, 13))
    for r1, r2 in zip(ref[5:], recs[5:]):
        assert r2["loss"] == pytest.approx(r1["loss"], abs=LOSS_ATOL), r1["step"]
    a, b = load_file(str(fsdp_one / "final" / "model.safetensors")), load_file(str(resumed / "final" / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-4, rtol=0)


def test_fsdp_checkpoint_is_not_resumed_by_ddp(prepared, tmp_path):
    run_train(prepared, tmp_path, "x", cfg_over={**FSDP, "train": {"max_steps": 2, "save_interval": 2}}, stop_after=1)
    _, proc = run_train(prepared, tmp_path, "x", cfg_over={"train": {"max_steps": 2, "save_interval": 2}}, expect_ok=False)
    assert proc.returncode != 0 and "torch.zero" in proc.stderr


def test_activation_checkpointing_trains_the_same(prepared, tmp_path):
    over = {"train": {"max_steps": 3, "eval_interval": 3}}
    plain, _ = run_train(prepared, tmp_path, "plain", cfg_over=over)
    ac, proc = run_train(prepared, tmp_path, "ac", cfg_over={**over, "parallel": {"activation_checkpointing": True}})
    assert "activation checkpointing on" in proc.stderr
    for r1, r2 in zip(losses(plain), losses(ac)):
        assert r2["loss"] == pytest.approx(r1["loss"], abs=1e-6), r1["step"]


def test_fsdp_resume_after_kill_9_equals_the_uninterrupted_run(prepared, fsdp_one, tmp_path):
    """2 FSDP2 processes under torchrun, SIGKILLed (the whole process group, as `kill -9`) once the first
    checkpoint is sealed, while training goes on; the rerun resumes from the newest complete checkpoint
    and its losses and final weights equal the uninterrupted run's. Metrics never repeat a step."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import merge, torch_train_args

    cfg = merge(prepared["cfg"], FSDP)
    out = tmp_path / "killed"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "llmpipe"]
    cmd = launcher + torch_train_args(cfg, prepared["init"], prepared["view"], out / "ckpt", out / "metrics.jsonl", out / "final")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not list((out / "ckpt").glob("step_*/done")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (out / "final").exists(), "the kill came too late: training had finished"
    resumed, rerun = run_train(prepared, tmp_path, "killed", cfg_over=FSDP, nproc=2)
    assert "resumed from" in rerun.stderr
    recs, ref = losses(resumed), losses(fsdp_one)
    assert [r["step"] for r in recs] == list(range(1, 13))  # no step twice, none missing
    for r1, r2 in zip(ref, recs):
        assert r2["loss"] == pytest.approx(r1["loss"], abs=LOSS_ATOL), r1["step"]
    a, b = load_file(str(fsdp_one / "final" / "model.safetensors")), load_file(str(resumed / "final" / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-4, rtol=0)
