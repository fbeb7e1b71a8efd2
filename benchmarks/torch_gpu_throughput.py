"""Training throughput of the torch backend on GPUs: tokens/s per GPU and MFU for a ~1B Llama at seq
4096 in bf16, DDP and FSDP2, torch.compile on/off, document masking on/off, beside a minimal training
loop (the same model, the same AdamW and bf16 autocast, nothing else of llmpipe's) as the reference.

  python benchmarks/torch_gpu_throughput.py [--gpus 8] [--modes ddp,fsdp2,minimal] [--compile off,on] \\
      [--masking off,on] [--shape 1b] [--seq 4096] [--micro 1] [--steps 10] [--adamw auto] [--loss auto,eager] \\
      [--out throughput.json]
  python benchmarks/torch_gpu_throughput.py --cpu-smoke   # a seconds-long check of the script on CPU (gloo)

Without a CUDA GPU (and without --cpu-smoke) it says so and exits 0. Each case is its own `torchrun
--standalone --nproc_per_node GPUS` process, so an OOM is recorded as such and frees everything.
Random tokens; with masking, rows are cut into documents of random lengths (mean --doc-len) and the step
uses llmpipe.train.documents' block-diagonal mask and per-document positions, as the trainer does.
Global batch = micro x GPUs (no accumulation); warmup steps (compile included) are not timed.

  ddp       llmpipe.backends.torch.train's step: fp32 weights + bf16 autocast, torch AdamW, DDP
  fsdp2     the same under fully_shard (parallel.zero 3): bf16 params, fp32 gradient reduction
  minimal   model(ids) -> loss -> backward -> AdamW step, bf16 autocast, DDP: the floor of overhead

--loss eager keeps the loss's fp32 chunks eager under --compile on (the trainer compiles them): that
kernel's gain, measured beside the trainer's form in the same run.

MFU = tokens/s/GPU x FLOPs per token (llmpipe.plan: 6 N_matmul + 12 L d s) / peak dense BF16 of the
GPU (--peak-tflops, else by name from llmpipe/devices.py). Figures: docs/benchmarks.md; one lent-GPU
session's run of all cases: benchmarks/gpu_lease.sh.
"""

from __future__ import annotations

import argparse
import itertools
import os
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
}
ADAMW = {"auto": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}  # build_optimizer's kernel choice


# ---------------------------------------------------------------- one case (inside torchrun)


def segments(micro: int, seq: int, doc_len: int, gen):
    """[micro, seq] segment ids: documents of lengths drawn uniformly from 1..2*doc_len, cut at the row end."""
    import torch

    rows = []
    for _ in range(micro):
        lengths, total = [], 0
        while total < seq:
            n = int(torch.randint(1, 2 * doc_len + 1, (1,), generator=gen))
            lengths.append(min(n, seq - total))
            total += lengths[-1]
        rows.append(torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)))
    return torch.stack(rows)


def run_case(case: dict) -> dict:
    import torch
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM

    from llmpipe import config as cfgmod
    from llmpipe.backends.torch.train import autocast_dtype, compile_layers, full_norm, fully_shard_model
    from llmpipe.train.documents import attention_kernel, model_inputs
    from llmpipe.train.loss import lm_loss_sum
    from llmpipe.train.optim import build_optimizer

    on_gpu = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if on_gpu else "gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    seq, micro, mode = case["seq"], case["micro"], case["mode"]
    hf = LlamaConfig(**SHAPES[case["shape"]], max_position_embeddings=seq, rope_theta=10000.0)
    t = cfgmod.load(None)["train"]
    t.update(seq_len=seq, micro_batch_size=micro, global_batch_size=micro * world, max_steps=1000, warmup_steps=10)
    amp = autocast_dtype("auto", device) if on_gpu else None
    torch.manual_seed(0)
    attn = attention_kernel(device, case["masking"])  # as the trainer: flex_attention for masking on CUDA
    model = LlamaForCausalLM._from_config(hf, attn_implementation=attn, dtype=torch.float32).to(device)
    model.train()
    if mode == "fsdp2":
        fully_shard_model(model, amp)
    if case["compile"]:
        compile_layers(model)
    opt, sched = build_optimizer(model, t, **ADAMW[case["adamw"]])
    net = torch.nn.parallel.DistributedDataParallel(model) if mode != "fsdp2" and world > 1 else model

    def step(batch):
        with torch.autocast(device.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
            if mode == "minimal":
                loss = net(input_ids=batch["input_ids"], labels=batch["input_ids"], use_cache=False).loss
            else:
                inputs = model_inputs(batch, device, case["masking"], attn)
                compiled = case["compile"] and case["loss"] == "auto"  # auto: the trainer's form
                loss, n = lm_loss_sum(net, labels=batch["input_ids"], compiled=compiled, **inputs)
                loss = loss / n
        loss.backward()
        if mode != "minimal":
            full_norm(torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"]))
            sched.step()
        opt.step()
        opt.zero_grad(set_to_none=True)

    gen = torch.Generator().manual_seed(rank)
    batches = [
        {
            "input_ids": torch.randint(0, hf.vocab_size, (micro, seq), generator=gen).to(device),
            "segment_ids": segments(micro, seq, case["doc_len"], gen).to(device),
        }
        for _ in range(2)
    ]
    return timed_steps(step, batches, case, hf, world, on_gpu, precision=str(amp or "fp32"), attention=attn)


# ---------------------------------------------------------------- driver


def cases(args) -> list[dict]:
    out = []
    for mode in args.modes.split(","):
        for comp in args.compile.split(","):
            for mask, loss in itertools.product(args.masking.split(","), args.loss.split(",")):
                if mode == "minimal" and (mask == "on" or loss != "auto"):  # the reference: no masking, HF's loss
                    continue
                if loss == "eager" and comp == "off":  # without compile the loss is eager already
                    continue
                out.append(
                    {
                        "shape": args.shape,
                        "mode": mode,
                        "compile": comp == "on",
                        "masking": mask == "on",
                        "seq": args.seq,
                        "micro": args.micro,
                        "steps": args.steps,
                        "warmup": args.warmup,
                        "doc_len": args.doc_len,
                        "adamw": args.adamw,
                        "loss": loss,
                    }
                )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_case_args(p)
    p.add_argument("--shape", default="1b", choices=sorted(SHAPES))
    p.add_argument("--modes", default="minimal,ddp,fsdp2")
    p.add_argument("--compile", default="off,on", help="off, on or both (off,on)")
    p.add_argument("--masking", default="off,on", help="document masking: off, on or both")
    p.add_argument("--doc-len", type=int, default=1024, help="mean document length with masking on")
    p.add_argument("--adamw", default="auto", choices=sorted(ADAMW), help="AdamW kernel (auto: llmpipe's, fused on CUDA)")
    p.add_argument(
        "--loss",
        default="auto",
        help="the loss's fp32 chunks: auto (the trainer's: compiled under --compile on), eager, or both (auto,eager)",
    )
    p.add_argument("--cpu-smoke", action="store_true", help="check the script on CPU: tiny shape, 2 gloo processes")
    args = p.parse_args()
    if in_torchrun(args, run_case):
        return

    import torch

    if args.cpu_smoke:
        args.shape, args.seq, args.steps, args.warmup, args.doc_len, args.compile = "tiny", 128, 2, 1, 32, "off"
        args.gpus = args.gpus or 2
    elif not torch.cuda.is_available():
        print(
            "no CUDA GPU available: nothing measured (this benchmark measures GPU throughput; --cpu-smoke checks the script on CPU)"
        )
        return
    named = [
        (
            f"{c['shape']:>4} {c['mode']:<8} seq {c['seq']} micro {c['micro']} compile {'on ' if c['compile'] else 'off'} "
            f"masking {'on ' if c['masking'] else 'off'}{'' if c['adamw'] == 'auto' else ' adamw ' + c['adamw']}"
            f"{' loss eager' if c['loss'] == 'eager' else ''}",
            c,
        )
        for c in cases(args)
    ]
    results = run_cases(__file__, named, args, args.gpus or torch.cuda.device_count())
    if any("error" in r for r in results) and args.cpu_smoke:
        raise SystemExit("a case failed")


if __name__ == "__main__":
    main()
