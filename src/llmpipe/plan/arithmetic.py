"""Model arithmetic for a Llama-style decoder: shape, parameters, FLOPs per token, memory per device.
No I/O: the trainers (MFU), the benchmarks and the planner import it alone. Formulas: llmpipe.plan."""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class Shape:
    """A Llama-style decoder (HF config.json names)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool

    @classmethod
    def from_hf(cls, conf: dict) -> Shape:
        need = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
        missing = [k for k in need if k not in conf]
        if missing:
            raise ValueError(f"model config lacks {', '.join(missing)}: the plan needs a Llama-style config.json")
        heads = conf["num_attention_heads"]
        return cls(
            conf["vocab_size"],
            conf["hidden_size"],
            conf["intermediate_size"],
            conf["num_hidden_layers"],
            heads,
            conf.get("num_key_value_heads") or heads,
            conf.get("head_dim") or conf["hidden_size"] // heads,
            bool(conf.get("tie_word_embeddings", False)),
        )


def parameters(s: Shape) -> int:
    """Llama parameter count: embeddings (+ untied LM head), per layer q/k/v/o + SwiGLU MLP + 2 RMSNorms, final norm."""
    d, q, kv = s.hidden_size, s.num_attention_heads * s.head_dim, s.num_key_value_heads * s.head_dim
    layer = d * q + 2 * d * kv + q * d + 3 * d * s.intermediate_size + 2 * d
    return s.vocab_size * d * (1 if s.tie_word_embeddings else 2) + s.num_hidden_layers * layer + d


def matmul_parameters(s: Shape, total: int) -> int:
    return total - (0 if s.tie_word_embeddings else s.vocab_size * s.hidden_size)


def flops_per_token(s: Shape, n_matmul: int, seq_len: int) -> int:
    return 6 * n_matmul + 12 * s.num_hidden_layers * s.num_attention_heads * s.head_dim * seq_len


def activation_bytes_per_token_layer(s: Shape, selective: bool = False) -> int:
    """bf16 tensors a layer saves for backward, per token: two norm inputs, two matmul inputs, q, k, v,
    attention output (flash attention: no s x s scores), gate, up and down-projection input (selective
    checkpointing recomputes the MLP: no gate / up / down inputs)."""
    q, kv = s.num_attention_heads * s.head_dim, s.num_key_value_heads * s.head_dim
    return 2 * (4 * s.hidden_size + 2 * q + 2 * kv + (0 if selective else 3 * s.intermediate_size))


def memory(
    s: Shape, n_params: int, seq_len: int, micro: int, accum: int, tp: int, pp: int, dp: int, zero: int, checkpointing: bool | str
) -> dict:
    """Bytes per device (see the module docstring for the model)."""
    shard = n_params / (tp * pp)
    weights = 2 * shard / (dp if zero >= 3 else 1)
    grads = 2 * shard / (dp if zero >= 2 else 1)
    optimizer = 12 * shard / (dp if zero >= 1 else 1)
    tokens = seq_len * micro
    layers = math.ceil(s.num_hidden_layers / pp)
    in_flight = min(pp, max(1, accum))
    full = activation_bytes_per_token_layer(s)
    if checkpointing == "selective":
        acts = tokens * layers * in_flight * activation_bytes_per_token_layer(s, selective=True) / tp
    elif checkpointing:
        acts = tokens * (layers * in_flight * 2 * s.hidden_size + full) / tp
    else:
        acts = tokens * layers * in_flight * full / tp
    logits = 4 * tokens * s.vocab_size / tp
    parts = {"weights": weights, "grads": grads, "optimizer": optimizer, "activations": acts, "logits": logits}
    return {**parts, "total": sum(parts.values())}


def duration(hours: float) -> str:
    """A time for people: 42.0 s, 12.5 min, 7.3 h, 41.2 d."""
    seconds = hours * 3600
    if seconds < 120:
        return f"{seconds:.1f} s"
    if hours < 2:
        return f"{seconds / 60:.1f} min"
    if hours < 48:
        return f"{hours:.1f} h"
    return f"{hours / 24:.1f} d"
