"""Steps, tokens, epochs and warmup from train.* and plan.tokens / plan.epochs."""

from __future__ import annotations

import math


def schedule(cfg: dict, train_rows: int) -> dict:
    t, p = cfg["train"], cfg["plan"]
    if train_rows is None and p["epochs"] is not None:
        raise ValueError("plan.epochs needs the data's size: build the token store first, or set plan.tokens")
    if train_rows is not None and train_rows < 1:
        raise ValueError(f"the train split has no full row of train.seq_len {t['seq_len']} tokens")
    gb, seq = t["global_batch_size"], t["seq_len"]
    per_step = gb * seq
    if p["tokens"] is not None:
        steps, source = -(-p["tokens"] // per_step), "plan.tokens"
    elif p["epochs"] is not None:
        steps, source = math.ceil(p["epochs"] * train_rows / gb), "plan.epochs"
    else:
        steps, source = t["max_steps"], "train.max_steps"
    steps = max(1, steps)
    warmup = round(p["warmup_fraction"] * steps) if p["warmup_fraction"] is not None else t["warmup_steps"]
    out = {
        "steps": steps,
        "steps_from": source,
        "global_batch_size": gb,
        "micro_batch_size": t["micro_batch_size"],
        "seq_len": seq,
        "tokens_per_step": per_step,
        "tokens": steps * per_step,
        "epochs": steps * gb / train_rows if train_rows else None,
        "warmup_steps": warmup,
        "warmup_fraction": warmup / steps,
        "train_max_steps": t["max_steps"],
        "overlay": None,
    }
    if steps != t["max_steps"] or warmup != t["warmup_steps"]:
        out["overlay"] = {"train": {"max_steps": steps, "warmup_steps": warmup}}
    return out
