"""Batch layout: which samples each rank sees at each micro step, identical for any world size."""

from __future__ import annotations

import numpy as np


def grad_accum_steps(global_batch: int, micro_batch: int, world_size: int) -> int:
    per_step = micro_batch * world_size
    if global_batch % per_step:
        raise ValueError(
            f"train.global_batch_size {global_batch} is not a multiple of micro_batch_size {micro_batch} "
            f"x world size {world_size} = {per_step}"
        )
    return global_batch // per_step


class Sampler:
    """Sample order: a seeded permutation per epoch; the step alone fixes the data position (resume)."""

    def __init__(self, num_samples: int, seed: int):
        if num_samples <= 0:
            raise ValueError("the training view has no rows")
        self.n, self.seed, self._perms = num_samples, seed, {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) >= 2:  # a global batch spans at most two epochs
                self._perms.pop(min(self._perms))
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        return self._perms[epoch]

    def global_batch(self, step: int, global_batch: int) -> np.ndarray:
        pos = np.arange(step * global_batch, (step + 1) * global_batch)
        return np.array([self._perm(int(p // self.n))[p % self.n] for p in pos])

    def micro_batches(self, step: int, global_batch: int, micro_batch: int, rank: int, world_size: int) -> list[np.ndarray]:
        """This rank's micro batches: global micro batch j goes to rank j % world_size."""
        ids = self.global_batch(step, global_batch)
        chunks = ids.reshape(-1, micro_batch)
        return [chunks[j] for j in range(rank, len(chunks), world_size)]

    def epoch_of(self, step: int, global_batch: int) -> float:
        return step * global_batch / self.n
