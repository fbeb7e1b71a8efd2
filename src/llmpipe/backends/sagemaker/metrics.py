"""Mode algorithm's metrics: per-step loss (and LR) parsed from the marketplace algorithm's log lines."""

from __future__ import annotations

import re


def metrics_from_logs(lines: list[str], pattern: str, cfg: dict, train_rows: int | None) -> list[dict]:
    """Per-step loss parsed from the algorithm's log lines (named groups step, loss, optional lr;
    without lr the shared schedule's value for that step, marked lr_from_schedule); tokens and epoch
    from the global batch, seq_len and the view's train rows."""
    from llmpipe.train.schedule import lr_at

    t = cfg["train"]
    rx = re.compile(pattern)
    recs: dict[int, dict] = {}
    for line in lines:
        m = rx.search(line)
        if not m:
            continue
        step = int(m.group("step"))
        seqs = step * t["global_batch_size"]
        rec = {
            "step": step,
            "loss": float(m.group("loss")),
            "tokens": seqs * t["seq_len"],
            "epoch": seqs / train_rows if train_rows else 0.0,
        }
        lr = m.groupdict().get("lr")
        if lr is not None:
            rec["lr"] = float(lr)
        else:
            rec["lr"] = lr_at(step - 1, t["lr"], t["min_lr"], t["warmup_steps"], t["max_steps"])
            rec["lr_from_schedule"] = True
        recs[step] = rec
    return [recs[s] for s in sorted(recs)]
