"""Packing: cut a token stream into fixed-length rows under an explicit remainder policy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IGNORE_INDEX = -100


@dataclass
class Packed:
    input_ids: np.ndarray  # [rows, seq_len]
    attention_mask: np.ndarray  # [rows, seq_len], 0 on padding
    labels: np.ndarray  # [rows, seq_len], IGNORE_INDEX on padding
    stats: dict


def pack(stream: np.ndarray, seq_len: int, remainder: str, pad_id: int) -> Packed:
    """Rows of exactly `seq_len` tokens from `stream`, in order.

    remainder: "drop" discards the last partial row (counted in stats["dropped_tokens"]);
    "pad" fills it with `pad_id` (attention_mask 0, label IGNORE_INDEX).
    """
    if remainder not in ("drop", "pad"):
        raise ValueError(f"unknown remainder policy {remainder!r} (drop | pad)")
    n = int(stream.size)
    full, rest = divmod(n, seq_len)
    rows = full + (1 if remainder == "pad" and rest else 0)
    ids = np.full((rows, seq_len), pad_id, dtype=np.int32)
    ids.reshape(-1)[: full * seq_len] = stream[: full * seq_len]
    mask = np.zeros((rows, seq_len), dtype=np.int8)
    mask.reshape(-1)[: full * seq_len] = 1
    if rows > full:
        ids[full, :rest] = stream[full * seq_len :]
        mask[full, :rest] = 1
    labels = np.where(mask == 1, ids, IGNORE_INDEX).astype(np.int32)
    stats = {
        "tokens_in": n,
        "rows": rows,
        "tokens_packed": int(mask.sum()),
        "dropped_tokens": rest if remainder == "drop" else 0,
        "padded_tokens": (seq_len - rest) if rows > full else 0,
    }
    return Packed(ids, mask, labels, stats)
