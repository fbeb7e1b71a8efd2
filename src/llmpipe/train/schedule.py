"""Learning rate: linear warmup from 0, then cosine decay to min_lr at max_steps."""

from __future__ import annotations

import math


def lr_at(step: int, lr: float, min_lr: float, warmup_steps: int, max_steps: int) -> float:
    """LR used for optimizer step `step` (0-based)."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    decay_steps = max(1, max_steps - 1 - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))
