"""The one language-model loss used by training, validation and evaluation (so they agree exactly)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llmpipe.data.pack import IGNORE_INDEX


def lm_loss_sum(model, input_ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of next-token cross-entropy over labelled positions, number of those positions).

    No attention mask is passed: rows are packed (all real tokens) or padded only at the end, and
    causal attention never lets a real token see later padding.
    """
    logits = model(input_ids=input_ids).logits
    shift_logits = logits[:, :-1].float().reshape(-1, logits.shape[-1])
    shift_labels = labels[:, 1:].reshape(-1).long()
    loss = F.cross_entropy(shift_logits, shift_labels, ignore_index=IGNORE_INDEX, reduction="sum")
    return loss, (shift_labels != IGNORE_INDEX).sum()


@torch.no_grad()
def dataset_loss(model, dataset, batch_size: int, device: torch.device, autocast_dtype=None,
                 progress: str | None = None) -> tuple[float, int]:
    """Token-weighted mean loss over a whole view split, and the number of predicted tokens
    (with a progress bar named `progress`, if given)."""
    from tqdm import tqdm

    was_training = model.training
    model.eval()
    total, count = torch.zeros((), dtype=torch.float64), 0
    starts = range(0, len(dataset), batch_size)
    for start in tqdm(starts, desc=progress, unit=" batches", mininterval=10, disable=progress is None):
        batch = dataset[start : start + batch_size]
        with torch.autocast(device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
            loss, n = lm_loss_sum(model, batch["input_ids"].to(device), batch["labels"].to(device))
        total += loss.double().cpu()
        count += int(n)
    model.train(was_training)
    if count == 0:
        raise ValueError("validation data has no labelled tokens")
    return float(total / count), count
