"""The torch trainer's checkpoint contents: step_XXXXXXXX/ with model (safetensors), optimizer, scheduler,
RNG and the trainer state (step, fingerprint). Steps, sealing, verification and pruning are the shared
llmpipe.train.checkpoint's; this module builds a step under a temporary name, seals it, renames it into
place, and restores it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model

from llmpipe.io import atomic_path
from llmpipe.train.checkpoint import prune, seal, step_dir

log = logging.getLogger(__name__)


def save(root: Path, step: int, model, optimizer, scheduler, state: dict, keep: int) -> Path:
    target = step_dir(root, step)
    with atomic_path(target) as tmp:
        tmp.mkdir(parents=True)
        save_model(model, str(tmp / "model.safetensors"))  # handles tied (shared) weights
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        rng = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        torch.save(rng, tmp / "rng.pt")
        (tmp / "trainer_state.json").write_text(json.dumps({**state, "step": step}, indent=2, sort_keys=True))
        seal(tmp)
    prune(root, keep)
    log.info("checkpoint %s", target)
    return target


def load(path: Path, model, optimizer, scheduler) -> dict:
    """Restore everything saved by `save` (tensors only: weights_only=True) and return the trainer state."""
    load_model(model, str(path / "model.safetensors"), strict=True)
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    rng = torch.load(path / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return json.loads((path / "trainer_state.json").read_text())
