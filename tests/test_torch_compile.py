"""train.compile: the torch trainer's training forward/backward through torch.compile (inductor) trains
to the same losses as eager. On CPU inductor builds C++ kernels: skipped, with the reason, where no C++
compiler works."""

import shutil

import pytest
import torch

from tests.test_train_torch import losses, run_train

# Inductor fuses and reorders fp32 reductions: per-step losses agree with eager to ~1e-6 over 4 steps
# here; 1e-4 absolute leaves room for other CPUs' vector widths.
LOSS_ATOL = 1e-4


def inductor_works() -> str | None:
    """None when torch.compile can build a CPU kernel here, else why not."""
    if not shutil.which("g++") and not shutil.which("c++") and not shutil.which("clang++"):
        return "no C++ compiler (g++ / c++ / clang++) on PATH: inductor cannot build CPU kernels"
    try:
        torch.compile(lambda x: torch.sin(x) + 1)(torch.ones(4))
    except Exception as exc:  # noqa: BLE001 - the reason goes into the skip
        return f"torch.compile fails on this machine: {type(exc).__name__}: {exc}"[:300]
    return None


@pytest.fixture(scope="module")
def need_inductor():
    reason = inductor_works()
    if reason:
        pytest.skip(reason)


def test_compiled_training_matches_eager(prepared, tmp_path, need_inductor):
    steps = {"max_steps": 4, "eval_interval": 4, "save_interval": 4}
    eager, _ = run_train(prepared, tmp_path, "eager", cfg_over={"train": steps})
    compiled, proc = run_train(prepared, tmp_path, "compiled", cfg_over={"train": {**steps, "compile": True}})
    assert "compile on" in proc.stderr
    a, b = losses(eager), losses(compiled)
    assert len(a) == len(b) == 4
    for r1, r2 in zip(a, b):
        assert r2["loss"] == pytest.approx(r1["loss"], abs=LOSS_ATOL), r1["step"]
        assert r2["grad_norm"] == pytest.approx(r1["grad_norm"], rel=1e-3), r1["step"]
    assert b[-1]["val_loss"] == pytest.approx(a[-1]["val_loss"], abs=LOSS_ATOL)
    assert (compiled / "final" / "model.safetensors").is_file()  # state dict names unchanged by compile
