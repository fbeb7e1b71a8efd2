"""Resumable checkpoints: step_XXXXXXXX/ with model (safetensors), optimizer, scheduler, RNG, data position.

A checkpoint is built under a temporary name, gets its `done` marker, then is renamed into place:
a killed job never leaves a step_* folder that looks complete.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model

from llmpipe.io import atomic_path

log = logging.getLogger(__name__)

STEP_RE = re.compile(r"^step_(\d{8})$")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def complete_steps(root: Path) -> list[int]:
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := STEP_RE.match(p.name)) and (p / "done").is_file())


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
        (tmp / "done").write_text("")
    for old in complete_steps(root)[:-keep]:
        shutil.rmtree(step_dir(root, old))
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
