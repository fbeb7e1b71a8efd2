"""What a checkpoint must agree on to be resumed, and the one-line answer when a rerun changed it.

Snakemake deletes a job's old output before running it again, so a changed hyperparameter is caught
when the workflow is parsed (`changed_settings`), before any job: the newest complete checkpoint of the
run records the settings it was trained with (trainer_state.json), and they are compared here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

# train.* keys that may change between a checkpoint and its resume without changing the result.
RESUME_NEUTRAL = {"nproc", "nnodes", "launcher", "threads", "log_interval", "save_interval", "eval_interval",
                  "keep_checkpoints", "resume", "skip_nonfinite_steps", "slurm_auto_resume"}
STEP_RE = re.compile(r"^step_(\d{8})$")


def train_settings(cfg: dict) -> dict:
    return {k: v for k, v in sorted(cfg["train"].items()) if k not in RESUME_NEUTRAL}


def newest_state(root: Path) -> tuple[Path, dict] | None:
    """(step folder, trainer_state.json) of the newest complete checkpoint under `root`, or None."""
    if not root.is_dir():
        return None
    steps = sorted((p for p in root.iterdir() if STEP_RE.match(p.name) and (p / "done").is_file()), key=lambda p: p.name)
    for path in reversed(steps):
        state = path / "trainer_state.json"
        if state.is_file():
            return path, json.loads(state.read_text())
    return None


def changed_settings(cfg: dict, root: Path, run: str) -> str | None:
    """One line naming the train.* keys that differ from the run's newest checkpoint, with the two ways
    out; None when they agree, there is none, or train.resume is false."""
    found = newest_state(root) if cfg["train"]["resume"] else None
    if found is None or "fingerprint" not in found[1]:
        return None
    path, state = found
    old, new = state["fingerprint"].get("train", {}), train_settings(cfg)
    diff = [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if not diff:
        return None
    return (f"run {run!r} has checkpoints trained with other settings ({path.name}: train.{'; train.'.join(diff)}); "
            f"nothing was deleted. Keep them and train anew under another name (--config run=NEW), or restart this "
            "run from the initial model (train: {resume: false} in your --configfile; it replaces its checkpoints)")
