"""Document masking for packed rows: the view's `segment_ids` (document number inside a row, -1 on
padding; llmpipe.data.pack) become the model inputs that keep every document to itself.

- `document_mask`: a 4D boolean [B, 1, L, L] mask, True where query i may attend key j: j <= i and both
  in the same segment (block-diagonal causal). transformers passes a 4D mask to SDPA as it is
  (masking_utils returns a prepared 4D mask untouched), so no token attends across a document boundary.
- `document_positions`: position ids that restart at 0 at every document start (RoPE sees each document
  as if it began the row). A row's first segment may be the tail of a document that began in an earlier
  row: it starts at 0 too (the row does not know the offset).

Why an explicit mask and not transformers' packed-sequence detection (position_ids with no mask): the
detection is a heuristic over position jumps that transformers may change between releases; the
explicit mask says what we mean and works with SDPA, torch.compile and FSDP alike.

Which attention kernel runs is chosen here, once (`attention_kernel`), and the mask follows the model's
kernel (`model_inputs`):

| where | document masking | kernel (attn_implementation) | mask |
|---|---|---|---|
| CUDA | on | flex_attention | `document_block_mask`: a BlockMask (per 128x128 tile), no L x L tensor |
| CPU | on | sdpa | `document_mask`, dense [B, 1, L, L] (flex_attention has no backward on CPU) |
| any | off | sdpa | none: causal (flash kernel on CUDA) |
"""

from __future__ import annotations

import functools

import torch

SDPA, FLEX = "sdpa", "flex_attention"  # transformers' attn_implementation names


def document_positions(segment_ids: torch.Tensor) -> torch.Tensor:
    """[B, L] position of each token inside its segment (0 at each segment's first token)."""
    seg = segment_ids.long()
    idx = torch.arange(seg.shape[-1], device=seg.device).expand_as(seg)
    start = torch.ones_like(seg, dtype=torch.bool)
    start[:, 1:] = seg[:, 1:] != seg[:, :-1]
    first = torch.where(start, idx, torch.zeros_like(idx)).cummax(dim=-1).values
    return idx - first


def document_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """[B, 1, L, L] bool: causal attention within a segment only (padding, -1, attends to padding)."""
    seg = segment_ids.long()
    length = seg.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=seg.device).tril()
    return (seg[:, None, :, None] == seg[:, None, None, :]) & causal


def document_block_mask(segment_ids: torch.Tensor):
    """flex_attention's BlockMask of `document_mask`'s rule (causal within a segment), built from the
    [B, L] segment ids without an L x L tensor on CUDA (create_block_mask compiled, as torchtitan does)."""
    from torch.nn.attention.flex_attention import create_block_mask

    seg = segment_ids.long()

    def same_document_causal(b, h, q, kv):
        return (kv <= q) & (seg[b, q] == seg[b, kv])

    build = _compiled_create_block_mask() if seg.is_cuda else create_block_mask
    return build(same_document_causal, seg.shape[0], None, seg.shape[1], seg.shape[1], device=seg.device)


@functools.cache
def _compiled_create_block_mask():
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask)


def attention_kernel(device: torch.device, document_masking: bool) -> str:
    """The attention kernel (transformers' attn_implementation) of a model run on `device`: flex_attention
    with a BlockMask for document masking on CUDA, SDPA everywhere else (the table above). Callers log it."""
    return FLEX if document_masking and device.type == "cuda" else SDPA


def kernel_of(model) -> str:
    """The attention kernel a transformers model runs (under DDP: its module's)."""
    return getattr(model, "module", model).config._attn_implementation


def model_inputs(batch: dict, device: torch.device, document_masking: bool, kernel: str = SDPA) -> dict:
    """The forward-pass keyword arguments of a view batch: input_ids, and with document masking the
    block-diagonal mask in the form `kernel` takes (flex_attention: a BlockMask; SDPA: a dense 4D mask)
    and per-document positions (from the batch's segment_ids)."""
    inputs = {"input_ids": batch["input_ids"].to(device, non_blocking=True)}
    if document_masking:
        if kernel not in (SDPA, FLEX):  # e.g. eager attention adds the mask to the scores: a boolean one masks nothing
            raise ValueError(f"document masking needs attn_implementation {SDPA} or {FLEX}, not {kernel}")
        seg = batch["segment_ids"].to(device, non_blocking=True)
        inputs["attention_mask"] = document_block_mask(seg) if kernel == FLEX else document_mask(seg)
        inputs["position_ids"] = document_positions(seg)
    return inputs


def masking_wanted(setting, columns: list[str]) -> bool:
    """train.document_masking (auto | true | false) for a view with these columns: auto = on when the view
    has segment_ids; true requires them. One rule for the torch trainer and `llmpipe evaluate`."""
    has = "segment_ids" in columns
    if setting is True and not has:
        raise ValueError("train.document_masking is true but the view has no segment_ids (data.segment_ids false)")
    return setting is not False and has
