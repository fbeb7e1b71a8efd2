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


def test_compile_defaults_to_on_for_cuda_and_off_on_cpu():
    from llmpipe import config as cfgmod
    from llmpipe.backends.torch.train import compile_wanted

    default = cfgmod.load(None)["train"]["compile"]
    assert default == "auto"
    assert compile_wanted(default, torch.device("cuda", 0)) and not compile_wanted(default, torch.device("cpu"))
    assert compile_wanted(True, torch.device("cpu")) and not compile_wanted(False, torch.device("cuda", 0))


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


def trainer_steps(prepared, tmp_path, layers: int, steps: int, compile: bool) -> tuple[list[float], list[int]]:
    """`steps` optimizer steps of the torch trainer (llmpipe.backends.torch.train.Trainer, in this process)
    on a Llama of `layers` decoder layers, train.compile as given: their losses, and after each step the
    number of frames torch._dynamo has compiled so far."""
    from torch._dynamo.utils import counters

    from llmpipe.backends.torch.train import Trainer
    from llmpipe.model.init import init_model
    from tests.conftest import merge

    cfg = merge(prepared["cfg"], {"model": {"num_hidden_layers": layers}, "train": {"compile": compile, "max_steps": steps}})
    init = tmp_path / f"init{layers}"
    if not init.exists():
        init_model(cfg, prepared["tokenizer"], init)
    trainer = Trainer(cfg, init, prepared["view"], tmp_path / f"ckpt-{compile}")
    trainer.distribute()
    losses, frames = [], []
    try:
        for step in range(steps):
            losses.append(trainer.train_step(step)[0])
            frames.append(counters["frames"]["total"])
    finally:
        trainer.rows.close()
    return losses, frames


def test_compiled_layers_never_recompile(prepared, tmp_path, need_inductor):
    """train.compile on 10 decoder layers: no layer and no step recompiles (torch._dynamo's
    error_on_recompile makes any recompile an error), and nothing is compiled after the first step. A KV
    cache built in the training forward (no use_cache=False) recompiled every layer on its cache layer's
    `is_initialized` until recompile_limit (8); the rest ran eager (measured on an H100)."""
    from torch._dynamo.utils import counters

    eager, _ = trainer_steps(prepared, tmp_path, 10, 3, compile=False)
    torch._dynamo.reset()
    counters.clear()
    try:
        with torch._dynamo.config.patch(error_on_recompile=True):
            compiled, frames = trainer_steps(prepared, tmp_path, 10, 3, compile=True)
        ok = counters["frames"]["ok"]
    finally:
        torch._dynamo.reset()
    assert frames[0] >= 1 and ok == frames[0], (frames, ok)  # the layers ran compiled, not eager
    assert frames == [frames[0]] * 3  # no frame compiled after the first step
    assert compiled == pytest.approx(eager, abs=LOSS_ATOL)  # and they trained: the eager run's losses


def test_compiled_flex_layers_take_a_new_block_mask_without_recompiling(need_inductor):
    """The CUDA document-masking path under train.compile: every batch brings a new BlockMask (a new
    mask_mod closure over its segment ids) to the compiled layers; none recompiles, and the logits are
    the dense-mask SDPA path's. Forward only: flex_attention has no backward on CPU."""
    from llmpipe.train.documents import FLEX, SDPA, model_inputs
    from tests.test_torch_documents import ATOL, packed_rows, tiny_llama

    sdpa, flex = tiny_llama(attention=SDPA), tiny_llama(attention=FLEX)
    flex.load_state_dict(sdpa.state_dict())
    for layer in flex.model.layers:
        layer.compile()
    cpu, gen = torch.device("cpu"), torch.Generator().manual_seed(0)
    torch._dynamo.reset()
    try:
        with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
            for rows in ([[100, 1, 90, 70], [270, 20]], [[50, 250], [10, 10, 280]], [[300], [299, 1]]):
                seg = packed_rows(rows, 300)
                batch = {"input_ids": torch.randint(0, 128, seg.shape, generator=gen), "segment_ids": seg}
                got = flex(**model_inputs(batch, cpu, True, FLEX), use_cache=False).logits  # as lm_loss_sum
                want = sdpa(**model_inputs(batch, cpu, True, SDPA)).logits
                torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    finally:
        torch._dynamo.reset()
