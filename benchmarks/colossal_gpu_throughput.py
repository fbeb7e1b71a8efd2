"""Training throughput on GPUs: the colossal backend's plugins against the torch backend, same GPUs,
same run. Tokens/s per GPU, MFU and peak memory for a ~1B and the Llama-2-7B shape at seq 4096.

  .venvs/colossal/bin/python benchmarks/colossal_gpu_throughput.py [--gpus 8] [--shapes 1b,7b] \\
      [--plugins gemini,gemini_auto,zero2,torch] [--micro 1] [--steps 10] [--out throughput.json]
  ... --tiny       # a seconds-long check of the script itself on CPU (ddp + torch, gloo)

Run it with the ColossalAI environment's interpreter (envs/colossal.yaml) on a GPU machine. Each
(shape, plugin) case is its own `torchrun --standalone --nproc_per_node GPUS` process, so an OOM
is recorded as such and frees everything. Random tokens (throughput does not depend on them);
global batch = micro x GPUs (no accumulation); warmup steps are not timed.

  colossal plugins   what rules/train_colossal.smk runs: llmpipe.backends.colossal.train's plugin,
                     optimizer (HybridAdam), bf16, SDPA / flash-attn, gradient checkpointing (--no-gc
                     turns it off)
  torch              what the torch backend runs: fp32 weights + bf16 autocast, torch AdamW, DDP
                     over the GPUs, no gradient checkpointing (OOM for 7B on 80 GB: 16 B/parameter)

MFU = tokens/s/GPU x FLOPs per token (llmpipe.plan: 6 N_matmul + 12 L d s) / peak dense BF16 of the
GPU (--peak-tflops, else by name from llmpipe/devices.py).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from gpu_cases import add_case_args, in_torchrun, run_cases, timed_steps  # benchmarks/gpu_cases.py

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

SHAPES = {  # Llama shapes (HF config names); 1b: TinyLlama-1.1B's layout without GQA
    "tiny": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, vocab_size=512
    ),
    "1b": dict(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
    ),
    "7b": dict(
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
    ),
}


# ---------------------------------------------------------------- one case (inside torchrun)


def run_case(case: dict) -> dict:
    import torch
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM

    from llmpipe import config as cfgmod
    from llmpipe.backends.colossal import train as ct
    from llmpipe.train.loss import lm_loss_sum
    from llmpipe.train.optim import build_optimizer

    on_gpu = torch.cuda.is_available()
    seq, micro, plugin_name = case["seq"], case["micro"], case["plugin"]
    hf = LlamaConfig(**SHAPES[case["shape"]], max_position_embeddings=seq, rope_theta=10000.0)
    t = cfgmod.load(None)["train"]
    t.update(seq_len=seq, micro_batch_size=micro, max_steps=1000, warmup_steps=10)
    ct.init_distributed()
    world, rank = dist.get_world_size(), dist.get_rank()
    t["global_batch_size"] = micro * world
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    attn = ct.attention_impl(True, on_gpu)
    torch.manual_seed(0)
    offload = None  # Gemini's static placement (gemini case on GPU)

    if plugin_name == "torch":  # llmpipe.backends.torch.train's step
        from llmpipe.backends.torch.train import autocast_dtype

        model = LlamaForCausalLM._from_config(hf, attn_implementation=attn, torch_dtype=torch.float32).to(device)
        opt, sched = build_optimizer(model, t)
        net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
        amp = autocast_dtype("auto", device)

        def step(ids):
            with torch.autocast(device.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
                loss, n = lm_loss_sum(net, ids, ids)
            (loss / n).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
    else:
        from colossalai.booster import Booster
        from colossalai.lazy import LazyInitContext

        c = {"plugin": plugin_name, "tp": 1, "pp": 1, "zero_stage": 0}
        precision = ct.precision_of(t, plugin_name, on_gpu)
        if plugin_name == "gemini" and on_gpu:  # static placement from the plan's estimate, as the trainer
            c["gradient_checkpointing"] = case["gc"]
            total = torch.cuda.get_device_properties(device).total_memory
            offload = ct.gemini_placement(c, t, hf.to_dict(), world, total)
            ct.use_threads(ct.offload_threads(offload, t["threads"]))  # as the trainer
            if rank == 0:
                print("Gemini static placement:", offload["note"], flush=True)
        plugin = ct.make_plugin(c, t, precision, attn != "sdpa" or on_gpu, world, offload)
        ctx = LazyInitContext(default_device=device) if plugin_name != "ddp" else contextlib.nullcontext()
        with ctx:
            model = LlamaForCausalLM._from_config(hf, attn_implementation=attn, torch_dtype=torch.float32)
        if case["gc"]:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        cls, kw = ct.optimizer_kind(on_gpu)
        opt, sched = build_optimizer(model, t, cls, **kw)
        booster = Booster(plugin=plugin)
        model, opt, _, _, sched = booster.boost(model, opt, lr_scheduler=sched)

        def step(ids):
            loss, n = lm_loss_sum(model, ids, ids, torch.ones_like(ids))
            booster.backward(loss / n, opt)
            opt.step()
            sched.step()
            opt.zero_grad()

    gen = torch.Generator().manual_seed(rank)
    batches = [torch.randint(0, hf.vocab_size, (micro, seq), generator=gen).to(device) for _ in range(2)]
    out = timed_steps(step, batches, case, hf, world, on_gpu, attention=attn)
    return {**out, "placement": offload["note"]} if offload else out


# ---------------------------------------------------------------- driver


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_case_args(p)
    p.add_argument("--shapes", default="1b,7b")
    p.add_argument("--plugins", default="gemini,gemini_auto,zero2,torch")
    p.add_argument("--no-gc", action="store_true", help="colossal plugins without gradient checkpointing")
    p.add_argument("--tiny", action="store_true", help="check the script on CPU: tiny shape, ddp + torch, 2 processes")
    args = p.parse_args()
    if in_torchrun(args, run_case):
        return

    import torch

    if args.tiny:
        args.shapes, args.plugins, args.seq, args.steps, args.warmup = "tiny", "ddp,torch", 128, 3, 1
        args.gpus = args.gpus or 2
    elif not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU visible: this benchmark measures GPU throughput (--tiny checks the script on CPU)")
    named = [
        (
            f"{shape:>4} {plugin:<12}",
            {
                "shape": shape,
                "plugin": plugin,
                "seq": args.seq,
                "micro": args.micro,
                "steps": args.steps,
                "warmup": args.warmup,
                "gc": plugin != "torch" and not args.no_gc,
            },
        )
        for shape in args.shapes.split(",")
        for plugin in args.plugins.split(",")
    ]
    results = run_cases(__file__, named, args, args.gpus or torch.cuda.device_count())
    if any("error" in r for r in results) and args.tiny:  # a check of the script: a failed case fails it
        raise SystemExit("a case failed")


if __name__ == "__main__":
    main()
