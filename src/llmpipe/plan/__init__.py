"""plan: tokens, steps, training FLOPs, wall time, cost and per-device memory, before anything runs.

  llmpipe plan --config config/config.yaml [--config config/presets/llama-2-7b.yaml] [--out plan.json]

Tokens come from the packed view (view.json: rows x seq_len, counted), else the token store (counted
before packing), else an estimate (corpus bytes x tokens per byte measured on a sample with the run's
tokenizer; see llmpipe.plan.tokens). Formulas (Llama shapes; d = hidden, L = layers, s = seq_len):

  steps        plan.tokens: ceil(tokens / (global_batch x s)); plan.epochs: ceil(epochs x train_rows /
               global_batch); else train.max_steps
  FLOPs/token  6 N_matmul + 12 L (heads x head_dim) s        (fwd + bwd; PaLM appendix B)
               N_matmul = parameters - input embedding (a lookup, not a matmul; none when tied)
  time, cost   FLOPs / (devices x peak x MFU); hours x price_per_hour x instances
  memory       bf16 weights 2 B + bf16 grads 2 B + fp32 master/Adam m/v 12 B per parameter, over
               tp x pp, ZeRO stage over dp; bf16 activations saved for backward per token per layer
               2 (4d + 2 q + 2 kv + 3 ffn) B (q = heads x head_dim, kv = kv_heads x head_dim; flash
               attention, sequence parallel: / tp), x layers per stage x micro batches in flight
               (min(pp, grad accumulation)); with checkpointing 2 d B per layer + one layer's full set;
               selective (NxD: attention and MLP recomputed) 2 (4d + 2 q + 2 kv) B per layer;
               + fp32 logits 4 s V B / tp; fits if <= 90 % of HBM.
  layout       the one training runs: the parallel section (llmpipe.parallelism), with the backend's
               values for what it leaves null.

Modules, each importing only those before it: arithmetic (no I/O), schedule, hardware, inputs (model shape,
tokenizer, data sizes), tokens (the estimate), make (the plan), render (plan.md), cli (llmpipe plan).
"""

from __future__ import annotations

import importlib

# `from llmpipe.plan import build` and `plan.build` work without importing every module up front, so
# llmpipe.plan.arithmetic stays light for the trainers and benchmarks.
_WHERE = {
    **dict.fromkeys(
        ("GIB", "Shape", "parameters", "matmul_parameters", "flops_per_token", "activation_bytes_per_token_layer", "memory"),
        "arithmetic",
    ),
    **dict.fromkeys(("HARDWARE_PATH", "RESERVED_FRACTION", "load_hardware", "option"), "hardware"),
    **dict.fromkeys(
        (
            "checkpoint_parameters",
            "data_from_view",
            "rows_for",
            "data_from_store",
            "tokenizer_folder",
            "_tokenizer_matches",
            "shape_from_config",
            "sized_shape",
            "run_outputs",
        ),
        "inputs",
    ),
    "schedule": "schedule",
    **dict.fromkeys(("MANY_EPOCHS", "make_plan"), "make"),
    **dict.fromkeys(("summary_rows", "hardware_rows", "HARDWARE_HEADER", "markdown", "_duration"), "render"),
    **dict.fromkeys(("load_configs", "build", "decompress_warning", "main"), "cli"),
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"llmpipe.plan.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'llmpipe.plan' has no attribute {name!r}")
