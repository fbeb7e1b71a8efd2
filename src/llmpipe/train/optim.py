"""The optimizer recipe of every trainer we own: AdamW-style update with weight decay on matrices only
(train.weight_decay; biases, norms and other vectors get none) and the warmup + cosine LR schedule
(llmpipe.train.schedule.lr_at) as a LambdaLR."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from llmpipe.train.schedule import lr_at


def param_groups(model, weight_decay: float) -> list[dict]:
    """Trainable parameters in two groups: matrices (decayed) and the rest (not)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def adamw_kernel(device_types: set[str]) -> dict:
    """torch AdamW's kernel: fused where every parameter is on a CUDA GPU (one H100, 1.1B Llama at 4096,
    DDP + compile: 54,339 tok/s against 50,650 with torch's default foreach, docs/benchmarks.md), else
    torch's default (foreach; CPU runs keep it)."""
    return {"fused": True} if device_types == {"cuda"} else {}


def build_optimizer(model, t: dict, optimizer_cls=torch.optim.AdamW, **kwargs):
    """(optimizer, LambdaLR scheduler) from train.* `t`. `optimizer_cls` takes param groups, lr, betas and
    eps (torch AdamW by default, fused on CUDA: adamw_kernel; ColossalAI's HybridAdam with adamw_mode=True
    in `kwargs` on GPU)."""
    groups = param_groups(model, t["weight_decay"])
    if optimizer_cls is torch.optim.AdamW and not {"fused", "foreach"} & kwargs.keys():
        kwargs = {**adamw_kernel({p.device.type for g in groups for p in g["params"]}), **kwargs}
    opt = optimizer_cls(groups, lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"], **kwargs)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_at(s, t["lr"], t["min_lr"], t["warmup_steps"], t["max_steps"]) / t["lr"]
    )
    return opt, sched


KERNEL = ("fused", "foreach")  # how torch optimizers compute the update, not what: a run's own choice


@contextmanager
def kernel_kept(optimizer):
    """Around loading an optimizer state: the run's own kernel choice stays (load_state_dict takes every
    param-group key from the checkpoint, so a run resumed from an older or another machine's checkpoint
    would otherwise step with that run's kernel)."""
    flags = [{k: g[k] for k in KERNEL if k in g} for g in optimizer.param_groups]
    yield
    for group, kept in zip(optimizer.param_groups, flags, strict=True):
        group.update(kept)
