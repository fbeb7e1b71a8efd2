"""The colossal trainer's step pieces: which data-parallel replica a rank is (and how to sum over
replicas), the criterion ColossalAI's pipeline schedule calls, and moving a batch to the device."""

from __future__ import annotations

import torch
import torch.distributed as dist

from llmpipe.data.pack import IGNORE_INDEX
from llmpipe.train.loss import logits_loss_sum


class Layout:
    """Data-parallel rank and size (tp / pp ranks of one replica read the same rows)."""

    def __init__(self, plugin, amp: bool):
        group = getattr(plugin, "dp_group", None)
        self.dp_rank = dist.get_rank(group) if group is not None else dist.get_rank()
        self.dp_size = dist.get_world_size(group) if group is not None else dist.get_world_size()
        self.pipeline = bool(getattr(plugin, "pp_size", 1) > 1)
        stage = getattr(plugin, "stage_manager", None)
        self.last_stage = stage.is_last_stage() if self.pipeline else True
        self.amp = amp  # bf16 autocast: the ddp plugin (the other plugins cast the model themselves)
        # Ranks holding the same value: the tp ranks of a replica (of its last stage, with pp).
        self.copies = dist.get_world_size() // self.dp_size // (getattr(plugin, "pp_size", 1) if self.pipeline else 1)

    def autocast(self, device: torch.device):
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.amp)

    def sum_replicas(self, value: torch.Tensor) -> torch.Tensor:
        """Sum over the world of a per-rank value, each data-parallel replica counted once."""
        value = value.clone()
        dist.all_reduce(value)
        return value / self.copies


class PipelineLoss:
    """The criterion ColossalAI's pipeline schedule calls on the last stage, once a micro batch: adds up
    the loss sum and the labelled count, and returns the loss to back-propagate (the sum x `scale`)."""

    def __init__(self, device: torch.device, scale: float = 1.0):
        self.scale = scale
        self.total = torch.zeros((), dtype=torch.float64, device=device)
        self.count = torch.zeros((), dtype=torch.float64, device=device)

    def __call__(self, outputs, inputs: dict) -> torch.Tensor:
        part, n = logits_loss_sum(outputs["logits"], inputs["labels"])
        self.total += part.detach().double()
        self.count += n
        return part * self.scale


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def counts_nothing(batch: dict) -> dict:
    """`batch` with every label ignored: a forward that adds nothing to a loss sum or a labelled count."""
    return {**batch, "labels": torch.full_like(batch["labels"], IGNORE_INDEX)}
