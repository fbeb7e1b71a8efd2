"""Summed cross-entropy over [N, V] logits, a chunk of rows at a time in float32: the whole [N, V] float32
tensor never exists. Forward keeps each row's log-sum-exp; backward recomputes the softmax chunk by
chunk and writes the gradient in the logits' dtype. Same loss and gradients as F.cross_entropy of the
logits upcast to float32 (up to float32 summation order), at a fraction of the memory: a bf16 [N, V]
(the logits, kept for backward, and their gradient) instead of float32 copies and log-softmax outputs.
"""

from __future__ import annotations

import torch

from llmpipe.data.pack import IGNORE_INDEX

CHUNK_ELEMENTS = 2**25  # logits upcast at a time: 128 MiB of float32


class ChunkedCrossEntropySum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, chunk_rows: int) -> torch.Tensor:
        valid = targets != IGNORE_INDEX
        safe = torch.where(valid, targets, 0).unsqueeze(1)
        lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for start in range(0, logits.shape[0], chunk_rows):
            rows = slice(start, start + chunk_rows)
            x = logits[rows].float()
            lse[rows] = torch.logsumexp(x, dim=-1)
            per_row = lse[rows] - x.gather(1, safe[rows]).squeeze(1)
            total += torch.where(valid[rows], per_row, 0.0).sum()
        ctx.save_for_backward(logits, safe, valid, lse)
        ctx.chunk_rows = chunk_rows
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_total: torch.Tensor):
        logits, safe, valid, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.chunk_rows):
            rows = slice(start, start + ctx.chunk_rows)
            g = torch.exp(logits[rows].float() - lse[rows].unsqueeze(1))  # softmax
            g.scatter_add_(1, safe[rows], torch.full_like(safe[rows], -1, dtype=g.dtype))  # - one-hot of the target
            g *= valid[rows].unsqueeze(1) * grad_total  # ignored rows: no gradient
            grad[rows] = g
        return grad, None, None


def cross_entropy_sum(logits: torch.Tensor, targets: torch.Tensor, chunk_elements: int | None = None) -> torch.Tensor:
    """Sum over rows of -log softmax(logits[i])[targets[i]], rows with IGNORE_INDEX targets left out;
    logits [..., V], targets [...] (flattened alike)."""
    vocab = logits.shape[-1]
    chunk_rows = max(1, (chunk_elements or CHUNK_ELEMENTS) // vocab)
    return ChunkedCrossEntropySum.apply(logits.reshape(-1, vocab), targets.reshape(-1).long(), chunk_rows)
