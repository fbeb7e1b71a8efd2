"""Checkpoint steps, shared by every trainer we own: <root>/step_XXXXXXXX/ folders, sealed and verified.

A checkpoint is built under a temporary name, sealed (checksums.json: the sha256 of every file, then the
`done` marker), then renamed into place: a killed job never leaves a step_* folder that looks complete.
Resume takes the newest complete step whose files still match their checksums (`newest_intact`); a
damaged one is named and skipped for the next older intact one, never trained on. What goes inside a
step folder is the backend's (llmpipe.backends.torch.checkpoint, llmpipe.backends.colossal.checkpoint).
No torch here: the workflow reads checkpoints when it is parsed (llmpipe.train.resume).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

from llmpipe.io import sha256_file, write_json

log = logging.getLogger(__name__)

STEP_RE = re.compile(r"^step_(\d{8})$")
CHECKSUMS = "checksums.json"


class CheckpointError(RuntimeError):
    """No checkpoint to resume from verifies, or it belongs to another training setup."""


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def complete_steps(root: Path) -> list[int]:
    """Steps under `root` whose folder is marked complete (`done`), oldest first."""
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := STEP_RE.match(p.name)) and (p / "done").is_file())


def seal(folder: Path) -> None:
    """Record the sha256 of every file under `folder`, then mark it complete (`done`)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in (CHECKSUMS, "done"))
    write_json(folder / CHECKSUMS, {str(p.relative_to(folder)): sha256_file(p) for p in files})
    (folder / "done").write_text("complete\n")


def prune(root: Path, keep: int, saved: int) -> None:
    """After step `saved` was written: remove the complete steps above it (a run this one replaces, under
    train.resume false, or damaged steps it resumed below) and all but the newest `keep` of the rest."""
    steps = complete_steps(root)
    later, rest = [s for s in steps if s > saved], [s for s in steps if s <= saved]
    for old in later + rest[:-keep]:
        shutil.rmtree(step_dir(root, old), ignore_errors=True)


def damaged(folder: Path) -> list[str] | None:
    """Files of a sealed checkpoint that are missing or no longer match their sha256 ([] = intact);
    None for a checkpoint written before checksums were recorded."""
    record = folder / CHECKSUMS
    if not record.is_file():
        return None
    want = json.loads(record.read_text())
    return [name for name, digest in want.items() if not (folder / name).is_file() or sha256_file(folder / name) != digest]


def newest_intact(root: Path) -> Path | None:
    """The newest complete step whose files verify; damaged ones are logged by name and skipped."""
    steps = complete_steps(root)
    for step in reversed(steps):
        path = step_dir(root, step)
        bad = damaged(path)
        if bad is None:
            log.warning("checkpoint %s has no checksums (written by an older llmpipe): resuming without verifying", path)
            return path
        if not bad:
            return path
        older = [s for s in steps if s < step]
        log.error(
            "checkpoint %s is damaged: %s do not match their recorded sha256%s",
            path,
            ", ".join(bad),
            f"; falling back to step {older[-1]}" if older else "",
        )
    if steps:
        raise CheckpointError(
            f"no checkpoint in {root} verifies (steps {steps} are all damaged): delete {root} to start "
            "from the initial model, or set train.resume: false"
        )
    return None
