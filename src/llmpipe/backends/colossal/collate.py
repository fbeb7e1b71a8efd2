"""Batches from the packed hf view for the ColossalAI trainer.

Masks come from the view, never from a pad id: packed rows hold EOS between documents, and the
tokenizer's pad id is often EOS (GPT-2, Llama with pad = eos), so `input_ids != pad_id` (what
ColossalAI's LLaMA trainer does) would hide every real EOS from attention and from the loss. Here
attention_mask is the view's (0 only on the padding a `pad` remainder added) and labels are the
view's (-100 only there).
"""

from __future__ import annotations

import torch

FIELDS = ("input_ids", "attention_mask", "labels")


def collate(rows: dict) -> dict[str, torch.Tensor]:
    """A batch (dict of equal-length columns, as `dataset[list_of_ids]` returns) -> int64 tensors."""
    missing = [f for f in FIELDS if f not in rows]
    if missing:
        raise ValueError(f"the hf view lacks column(s) {missing}; rebuild it with `llmpipe pack`")
    out = {f: torch.as_tensor(rows[f], dtype=torch.long) for f in FIELDS}
    if out["input_ids"].shape != out["labels"].shape or out["input_ids"].shape != out["attention_mask"].shape:
        raise ValueError(f"view columns differ in shape: { {f: tuple(t.shape) for f, t in out.items()} }")
    return out
