"""Non-finite steps: a NaN / Inf loss or gradient norm never reaches the weights.

train.skip_nonfinite_steps = N: up to N such steps in a run are skipped (no optimizer or schedule step,
gradients dropped), as large-scale trainers do for rare spikes; the next one stops training with an
error naming the step. Checkpoints are only written after finite steps, so none holds a damaged model.
"""

from __future__ import annotations

import logging
import math

log = logging.getLogger(__name__)


class NonFiniteError(RuntimeError):
    """Training produced a non-finite loss or gradient norm beyond train.skip_nonfinite_steps."""


class NonFiniteGuard:
    def __init__(self, allowed: int):
        self.allowed, self.skipped = allowed, []

    def ok(self, step: int, loss: float, grad_norm: float | None) -> bool:
        """True: apply this step. False: skip it (within the allowance). Raises NonFiniteError beyond it."""
        bad = [
            f"{name} {value}"
            for name, value in (("loss", loss), ("grad_norm", grad_norm))
            if value is not None and not math.isfinite(value)
        ]
        if not bad:
            return True
        if len(self.skipped) < self.allowed:
            self.skipped.append(step)
            log.warning(
                "step %d: %s: skipped, no update (%d of train.skip_nonfinite_steps %d)",
                step,
                ", ".join(bad),
                len(self.skipped),
                self.allowed,
            )
            return False
        raise NonFiniteError(
            f"step {step}: {', '.join(bad)}: training stopped before updating the weights "
            f"(skipped before: {self.skipped or 'none'}; train.skip_nonfinite_steps {self.allowed}); "
            "the checkpoints hold finite weights: lower train.lr, check the data, or allow skips"
        )

    def state(self) -> dict:
        """What a checkpoint keeps of the guard: the steps skipped so far (the allowance is the run's)."""
        return {"skipped_nonfinite": list(self.skipped)}

    def restore(self, state: dict) -> None:
        """Go on counting from a checkpoint's trainer state (an older checkpoint has none: none skipped)."""
        self.skipped = list(state.get("skipped_nonfinite", []))

    def after_update(self, step: int, grad_norm: float | None) -> None:
        """A norm known only after the optimizer applied it (sharded optimizers): no skip can undo it, so
        a non-finite one stops training before anything is saved."""
        if grad_norm is not None and not math.isfinite(grad_norm):
            raise NonFiniteError(
                f"step {step}: grad_norm {grad_norm} (known after the update): training stopped "
                "before saving; the checkpoints hold finite weights: lower train.lr or check the data"
            )
