"""Torch backend: loss goes down, bitwise resume, DDP (2 gloo processes) == 1 process, resume guard."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import merge, torch_train_args


def run_train(prepared, tmp, name, cfg_over=None, stop_after=None, nproc=1, expect_ok=True):
    cfg = merge(prepared["cfg"], cfg_over or {})
    out = tmp / name
    launcher = (
        [sys.executable, "-m", "llmpipe"]
        if nproc == 1
        else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m", "llmpipe"]
    )
    cmd = launcher + torch_train_args(cfg, prepared["init"], prepared["view"], out / "ckpt", out / "metrics.jsonl", out / "final")
    if stop_after:
        cmd += ["--stop-after", str(stop_after)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if expect_ok:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def losses(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def plan_flops_per_token(prepared) -> int:
    """FLOPs per token of the trained model by the plan's arithmetic (llmpipe.plan)."""
    from llmpipe.plan.arithmetic import Shape, flops_per_token, matmul_parameters, parameters

    shape = Shape.from_hf(json.loads((prepared["init"] / "config.json").read_text()))
    return flops_per_token(shape, matmul_parameters(shape, parameters(shape)), prepared["cfg"]["train"]["seq_len"])


@pytest.fixture(scope="module")
def baseline(prepared, tmp_path_factory):
    out, _ = run_train(prepared, tmp_path_factory.mktemp("base"), "a")
    return out


def test_loss_goes_down_and_final_model_written(baseline):
    recs = losses(baseline)
    assert [r["step"] for r in recs] == list(range(1, 13))
    first, last = (sum(r["loss"] for r in part) / 3 for part in (recs[:3], recs[-3:]))
    assert last < first - 0.2
    vals = [r["val_loss"] for r in recs if "val_loss" in r]
    assert len(vals) == 2 and vals[-1] < vals[0]
    summary = json.loads((baseline / "final" / "train_summary.json").read_text())
    assert summary["final_val_loss"] == vals[-1]
    assert (baseline / "final" / "model.safetensors").is_file()


def test_metrics_carry_model_tflops_and_no_mfu_on_cpu(prepared, baseline):
    flops = plan_flops_per_token(prepared)
    for r in losses(baseline):
        assert r["tflops_per_device"] == pytest.approx(r["tokens_per_s"] * flops / 1e12, rel=1e-12), r["step"]
        assert r["tflops_per_device"] > 0 and r["mfu"] is None  # a CPU has no peak in llmpipe.devices


def test_resume_after_stop_is_bitwise_identical(prepared, baseline, tmp_path):
    out, _ = run_train(prepared, tmp_path, "b", stop_after=5)
    assert not (out / "final").exists()
    assert sorted(p.name for p in (out / "ckpt").iterdir()) == ["step_00000004", "step_00000005"]
    out, proc = run_train(prepared, tmp_path, "b")
    assert "resumed from" in proc.stderr
    a = load_file(str(baseline / "final" / "model.safetensors"))
    b = load_file(str(out / "final" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert [r["loss"] for r in losses(out)] == [r["loss"] for r in losses(baseline)]


def test_resume_from_partial_checkpoint_folder_is_ignored(prepared, baseline, tmp_path):
    """A killed save leaves only a temp folder or a step folder without `done`: never resumed from."""
    out, _ = run_train(prepared, tmp_path, "c", stop_after=4)
    ckpt = out / "ckpt"
    shutil.copytree(ckpt / "step_00000004", ckpt / "step_00000008")
    (ckpt / "step_00000008" / "done").unlink()
    (ckpt / "step_00000008" / "model.safetensors").write_bytes(b"truncated")
    out, proc = run_train(prepared, tmp_path, "c")
    assert "step_00000004 (step 4)" in proc.stderr
    a = load_file(str(baseline / "final" / "model.safetensors"))
    b = load_file(str(out / "final" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_changed_hyperparameters(prepared, tmp_path):
    run_train(prepared, tmp_path, "d", stop_after=4)
    _, proc = run_train(prepared, tmp_path, "d", cfg_over={"train": {"lr": 1e-3}}, expect_ok=False)
    assert proc.returncode != 0
    assert "different training setup" in proc.stderr and "'lr'" in proc.stderr


def test_ddp_two_processes_match_one_process(prepared, baseline, tmp_path):
    out, proc = run_train(prepared, tmp_path, "ddp", nproc=2)
    assert "world 2" in proc.stderr and "grad accumulation 2" in proc.stderr
    one, two = losses(baseline), losses(out)
    assert len(one) == len(two) == 12
    for r1, r2 in zip(one, two):
        assert r2["loss"] == pytest.approx(r1["loss"], abs=1e-4), r1["step"]
    assert two[-1]["val_loss"] == pytest.approx(one[-1]["val_loss"], abs=1e-4)
    flops = plan_flops_per_token(prepared)  # tokens_per_s counts both ranks' tokens: per device is half
    assert all(r["tflops_per_device"] == pytest.approx(r["tokens_per_s"] * flops / 2 / 1e12, rel=1e-12) for r in two)
    last = two[-1]
    assert f"{last['tokens_per_s']:.0f} tok/s {last['tflops_per_device']:.3g} TFLOP/s/device val_loss" in proc.stderr


def test_bf16_autocast_runs_on_cpu_when_asked(prepared, baseline, tmp_path):
    out, proc = run_train(prepared, tmp_path, "bf16", cfg_over={"train": {"precision": "bf16"}})
    assert "precision torch.bfloat16" in proc.stderr
    summary = json.loads((out / "final" / "train_summary.json").read_text())
    assert summary["precision"] == "torch.bfloat16"
    one, bf = losses(baseline), losses(out)
    assert bf[-1]["loss"] < bf[0]["loss"]
    assert bf[-1]["loss"] != one[-1]["loss"]  # really computed in bf16, not fp32
    assert bf[-1]["loss"] == pytest.approx(one[-1]["loss"], abs=0.1)


def test_adamw_fused_on_cuda_only_and_explicit_kernel_wins():
    """torch AdamW's fused kernel where every parameter is on CUDA (measured faster on an H100:
    docs/benchmarks.md); CPU and mixed placements keep torch's default; an explicit choice or another
    optimizer class gets nothing added."""
    from llmpipe.train.optim import adamw_kernel, build_optimizer

    assert adamw_kernel({"cuda"}) == {"fused": True}
    assert adamw_kernel({"cpu"}) == adamw_kernel({"cuda", "cpu"}) == {}
    t = {"weight_decay": 0.1, "lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "min_lr": 0.0}
    t |= {"warmup_steps": 1, "max_steps": 10}
    model = torch.nn.Linear(4, 4)
    opt, _ = build_optimizer(model, t)
    assert not opt.param_groups[0]["fused"]
    opt, _ = build_optimizer(model, t, foreach=False)
    assert opt.param_groups[0]["foreach"] is False and not opt.param_groups[0]["fused"]
    seen = {}

    class Recorder(torch.optim.SGD):
        def __init__(self, groups, lr, betas, eps, **kw):
            seen.update(kw)
            super().__init__(groups, lr=lr)

    build_optimizer(model, t, Recorder, adamw_mode=True)
    assert seen == {"adamw_mode": True}


def test_resume_keeps_this_runs_adamw_kernel(tmp_path):
    """A checkpoint written with torch's default kernel (an older run, or a CPU machine's) resumed by a run
    that steps with the fused one: the state is the checkpoint's, the kernel stays the run's."""
    from llmpipe.backends.torch import checkpoint

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    saved = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(saved, lambda s: 1.0)
    model(torch.randn(4, 8)).square().sum().backward()
    saved.step()
    path = checkpoint.save(tmp_path, 1, model, saved, sched, {}, keep=1)
    run = torch.optim.AdamW(model.parameters(), fused=True)
    checkpoint.load(path, model, run, torch.optim.lr_scheduler.LambdaLR(run, lambda s: 1.0))
    assert run.param_groups[0]["fused"] is True and saved.param_groups[0]["fused"] is None
    for p in model.parameters():
        assert torch.equal(run.state[p]["exp_avg"], saved.state[p]["exp_avg"])


def test_validation_rows_are_shared_among_processes_and_capped(prepared):
    """DDP validation: each process scores every world-th row, the (loss sum, tokens) pairs summed, so the
    result is the whole split's (before, rank 0 scored all of it while the others waited in a barrier,
    past the process group's timeout on a large split). eval.max_batches: the split's first rows only,
    the same on any number of processes."""
    import datasets
    from transformers import AutoModelForCausalLM

    from llmpipe.train.loss import dataset_loss

    model = AutoModelForCausalLM.from_pretrained(str(prepared["init"]), dtype=torch.float32)
    rows = datasets.load_from_disk(str(prepared["view"] / "train")).with_format("torch")
    assert len(rows) >= 5
    cpu = torch.device("cpu")
    whole = dataset_loss(model, rows, 2, cpu)
    pairs = []
    keep = lambda pair: pairs.append(pair) or pair  # what an all-reduce would sum
    for world in (2, 3):
        pairs.clear()
        parts = [dataset_loss(model, rows, 2, cpu, share=(r, world), reduce=keep) for r in range(world)]
        assert all(tokens < whole[1] for _, tokens in parts)  # each scored a share, not the whole
        total = sum(pairs)
        assert int(total[1]) == whole[1] and float(total[0] / total[1]) == pytest.approx(
            whole[0], rel=1e-6
        )  # float32 forwards of other batches
    first = dataset_loss(model, rows.select(range(4)), 2, cpu)
    assert dataset_loss(model, rows, 2, cpu, max_batches=2) == pytest.approx(first, rel=1e-6)
    pairs.clear()
    for r in range(3):
        dataset_loss(model, rows, 2, cpu, share=(r, 3), reduce=keep, max_batches=2)
    assert int(sum(pairs)[1]) == first[1]
    # no autograd graph: each batch's activations would stay alive to the end (a review measured 8.3 GB vs
    # 86 MB on CPU when a refactor moved torch.no_grad off dataset_loss)
    seen = []
    dataset_loss(model, rows, 2, cpu, reduce=lambda pair: seen.append((torch.is_grad_enabled(), pair.requires_grad)) or pair)
    assert seen == [(False, False)]


def test_a_step_checkpoint_exports_and_a_mistyped_folder_is_one_line(prepared, baseline, tmp_path):
    """A step folder carries config.json: `llmpipe export` takes it (the last step is the final model). A
    path that is not a folder is one line, never a Hub download: from_pretrained took `runs/final` for a
    repo id (~26 s of retries offline, then a traceback)."""
    step = baseline / "ckpt" / "step_00000012"
    cfg = json.dumps({"export": {"dtype": "float32"}})
    llm = [sys.executable, "-m", "llmpipe"]
    common = ["--config", cfg, "--tokenizer", str(prepared["tokenizer"]), "--manifest", str(prepared["manifest"])]
    subprocess.run(
        [*llm, "export", *common, "--trained", str(step), "--out", str(tmp_path / "hf")], check=True, capture_output=True
    )
    a, b = (load_file(str(p / "model.safetensors")) for p in (baseline / "final", tmp_path / "hf"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for cmd in (
        ["export", *common, "--trained", "runs/finall", "--out", str(tmp_path / "x")],
        [*torch_train_args(prepared["cfg"], "runs/init", prepared["view"], *(tmp_path / n for n in "cmf"))],
        [*torch_train_args(prepared["cfg"], prepared["init"], tmp_path / "nope", *(tmp_path / n for n in "cmf"))],
    ):
        proc = subprocess.run(
            [*llm, *cmd], capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "0"}
        )
        assert proc.returncode != 0 and "Traceback" not in proc.stderr and "huggingface.co" not in proc.stderr, proc.stderr[
            -2000:
        ]
        assert proc.stderr.strip().splitlines()[-1].endswith(": no such folder"), proc.stderr[-2000:]
