"""Gemini's static placement from the plan's memory estimate: the smallest share of the optimizer state
(then of the parameters) moved to CPU memory so that one GPU holds the rest. ColossalAI's own defaults
keep everything on the GPU (offload_optim_frac 0.0), which is what ran out of memory for a 7B on one
80 GB GPU; `gemini_auto` fits but offloads nearly everything (1.4 % MFU there). On one H100 the 7B at
micro 1 with 45 % of the optimizer state offloaded peaked at 42.3 GiB where this estimate said 68.5:
gradients had been counted apart from the parameter chunks Gemini writes them into
(benchmarks/h100-2026-11-27/c7b.json; docs/benchmarks.md). Without that term it placed 25 % and peaked at
59.6 GiB (benchmarks/h100-2026-11-27b/c7b.json)."""

from __future__ import annotations

import math

from llmpipe.plan.arithmetic import GIB, Shape, memory, parameters

CAP = 0.9  # share of the GPU's memory the estimate may fill (allocator fragmentation, CUDA context, buffers)
STEP = 0.05  # fractions are rounded up to this
SLACK = 2**20  # bytes: what rounding the fractions may leave over


def _up(x: float) -> float:
    return min(1.0, math.ceil(round(x / STEP, 6)) * STEP)


def gemini_static(shape: Shape, seq_len: int, micro: int, accum: int, dp: int, checkpointing: bool, device_bytes: int) -> dict:
    """{"offload_optim_frac", "offload_param_frac", "estimate" (bytes per GPU by part, all on the GPU),
    "placed" (the same after offloading), "budget"}
    for Gemini (ZeRO-3 over dp GPUs). Raises ValueError naming the sizes when even full offload does not fit."""
    est = memory(shape, parameters(shape), seq_len, micro, accum, 1, 1, dp, 3, checkpointing)
    if accum == 1:  # Gemini writes gradients into the bf16 parameter chunks (reuse_fp16_chunk) unless it accumulates
        est = {**est, "grads": 0, "total": est["total"] - est["grads"]}
    budget = CAP * device_bytes
    over = est["total"] - budget
    optim = _up(over / est["optimizer"]) if over > 0 else 0.0
    over -= optim * est["optimizer"]
    param = 0.0
    if over > SLACK:  # ColossalAI: param offload only takes effect with the whole optimizer state offloaded
        optim, param = 1.0, _up(over / (est["weights"] + est["grads"]))
        over -= param * (est["weights"] + est["grads"])
    if over > SLACK:
        raise ValueError(
            f"Gemini cannot fit this model on {dp} GPU(s) of {device_bytes / GIB:.1f} GiB even with parameters and "
            f"optimizer state in CPU memory: activations {est['activations'] / GIB:.1f} GiB + logits "
            f"{est['logits'] / GIB:.1f} GiB per GPU (plan estimate, {CAP:.0%} of the GPU usable); turn on "
            "parallel.activation_checkpointing, lower train.micro_batch_size or use more GPUs"
        )
    placed = {
        **est,
        "optimizer": est["optimizer"] * (1 - optim),
        "weights": est["weights"] * (1 - param),
        "grads": est["grads"] * (1 - param),
    }
    placed["total"] = sum(v for k, v in placed.items() if k != "total")
    return {"offload_optim_frac": optim, "offload_param_frac": param, "estimate": est, "placed": placed, "budget": budget}


def describe(p: dict) -> str:
    e, placed = p["estimate"], p["placed"]
    return (
        f"plan estimate {e['total'] / GIB:.1f} GiB per GPU (weights {e['weights'] / GIB:.1f}, grads "
        f"{e['grads'] / GIB:.1f}, optimizer {e['optimizer'] / GIB:.1f}, activations {e['activations'] / GIB:.1f}, "
        f"logits {e['logits'] / GIB:.1f}) against {p['budget'] / GIB:.1f} GiB usable: offload_optim_frac "
        f"{p['offload_optim_frac']:.2f}, offload_param_frac {p['offload_param_frac']:.2f} "
        f"({placed['total'] / GIB:.1f} GiB left on the GPU)"
    )
