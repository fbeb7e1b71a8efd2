"""The one language-model loss used by training, validation and evaluation (so they agree exactly)."""

from __future__ import annotations

import torch

from llmpipe.data.pack import IGNORE_INDEX
from llmpipe.train.cross_entropy import cross_entropy_sum


def logits_loss_sum(logits: torch.Tensor, labels: torch.Tensor, compiled: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of next-token cross-entropy over labelled positions, number of those positions): position i's
    logits predict label i + 1; IGNORE_INDEX labels (padding) count for nothing. In float32 a chunk of
    positions at a time (llmpipe.train.cross_entropy): no float32 copy of the whole logits; `compiled`:
    each chunk through torch.compile."""
    targets = torch.full_like(labels, IGNORE_INDEX)
    targets[:, :-1] = labels[:, 1:]  # the last position predicts nothing
    return cross_entropy_sum(logits, targets, compiled=compiled), (targets != IGNORE_INDEX).sum()


def lm_loss_sum(
    model,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`logits_loss_sum` of the model's forward pass (`compiled`: its loss through torch.compile).

    Without an attention mask: rows are packed (all real tokens) or padded only at the end, and causal
    attention never lets a real token see later padding. The colossal trainer passes the view's mask;
    the torch trainer's document masking a 4D block-diagonal mask and per-document position_ids
    (llmpipe.train.documents). No KV cache: without use_cache=False transformers builds one every
    forward, and under torch.compile each decoder layer recompiles on its cache layer's state.
    """
    inputs = {"input_ids": input_ids, "use_cache": False}
    if attention_mask is not None:
        inputs["attention_mask"] = attention_mask
    if position_ids is not None:
        inputs["position_ids"] = position_ids
    return logits_loss_sum(model(**inputs).logits, labels, compiled)


def label_count(batches: list[dict]) -> int:
    """Labelled (predicted) positions in micro batches of the view: what a step's loss is averaged over."""
    return sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in batches)


def shared_rows(size: int, batch_size: int, rank: int, world: int, max_batches: int | None = None):
    """The rows (a range) a process scores in each validation forward: rows rank, rank + world, ... of a split's
    first max_batches * batch_size rows (the same rows on any world size; all when None), in as many forwards
    as the process with the most. An empty range: this process's rows ran out, its forward counts for
    nothing (FSDP2, Gemini, ZeRO and tp gather weights in each forward, so every process must make them)."""
    size = size if max_batches is None else min(size, max_batches * batch_size)
    rows = range(rank, size, world)
    for start in range(0, -(-size // world), batch_size):
        yield rows[start : start + batch_size]


@torch.no_grad()
def dataset_loss(
    model,
    dataset,
    batch_size: int,
    device: torch.device,
    autocast_dtype=None,
    progress: str | None = None,
    document_masking: bool = False,
    share: tuple[int, int] = (0, 1),
    reduce=None,
    max_batches: int | None = None,
) -> tuple[float, int]:
    """Token-weighted mean loss over a whole view split, and the number of predicted tokens
    (with a progress bar named `progress`, if given; with `document_masking`, each document of a packed
    row on its own, as the torch trainer trains it: llmpipe.train.documents).

    `share` (rank, world) and `max_batches`: the rows this process scores (shared_rows); `reduce` sums the
    (loss sum, tokens) pair over the processes."""
    from tqdm import tqdm

    from llmpipe.train.documents import SDPA, kernel_of, model_inputs

    kernel = kernel_of(model) if document_masking else SDPA
    was_training = model.training
    model.eval()
    rank, world = share
    total, count = torch.zeros((), dtype=torch.float64), 0
    forwards = list(shared_rows(len(dataset), batch_size, rank, world, max_batches))
    for ids in tqdm(forwards, desc=progress, unit=" batches", mininterval=10, disable=progress is None):
        batch = dataset[ids.start : ids.stop] if world == 1 else dataset[list(ids) or [0]]
        labels = batch["labels"] if len(ids) else torch.full_like(batch["labels"], IGNORE_INDEX)
        with torch.autocast(device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
            loss, n = lm_loss_sum(model, labels=labels.to(device), **model_inputs(batch, device, document_masking, kernel))
        total += loss.double().cpu()
        count += int(n)
    model.train(was_training)
    if reduce is not None:
        total, count = reduce(torch.stack([total, torch.tensor(float(count), dtype=torch.float64)])).tolist()
        count = int(count)
    if count == 0:
        raise ValueError("validation data has no labelled tokens")
    return float(total / count), count
