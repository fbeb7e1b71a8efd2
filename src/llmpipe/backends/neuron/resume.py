"""Resume guard of the neuron backend. NxD's step_<N> checkpoints carry none of our settings, so before it
launches training `neuron-train` records the fingerprint they are trained under (llmpipe.train.resume:
train.* settings, the NxD layout, the initial model, the data view) beside them in RECORD, and refuses
to resume under another. The workflow compares it before any job (Backend.newest_state), as for the
torch and colossal trainers. Under train.resume false the old steps are removed first: NxD would keep
later ones beside the new run's, and neuron_merge takes the newest.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from llmpipe.io import write_json

log = logging.getLogger(__name__)

STEP_RE = re.compile(r"^step_(\d+)$")
DP_RANK_RE = re.compile(r"^dp_rank_(\d+)_")  # step_<N>/optim/dp_rank_XX_tp_rank_XX_pp_rank_XX.pt (+ xser's .info.pt, .tensors)
RECORD = "llmpipe-fingerprint.json"  # in the NxD checkpoint dir, beside step_<N>/


def complete_steps(ckpt_dir: Path) -> list[int]:
    """Training steps under an NxD checkpoint dir that have their `done` marker, ascending."""
    if not ckpt_dir.is_dir():
        return []
    return sorted(
        int(m.group(1))
        for p in ckpt_dir.iterdir()
        if (m := STEP_RE.match(p.name)) and (p / "done").is_file() and (p / "model").is_dir()
    )


def resume_sections(cfg: dict) -> dict:
    """The layout NxD's rank files and optimizer shards are cut by: a checkpoint resumes only under it."""
    from llmpipe.backends.neuron.layout import Layout

    return {"neuron": {**Layout.from_config(cfg).to_json(), "zero": cfg["parallel"].get("zero")}}


def recorded(ckpt_dir: Path) -> tuple[Path, dict] | None:
    """(newest complete step, {"fingerprint": ...} it was trained under) or None (no step, or no record)."""
    steps = complete_steps(ckpt_dir)
    if not steps or not (ckpt_dir / RECORD).is_file():
        return None
    return ckpt_dir / f"step_{steps[-1]}", json.loads((ckpt_dir / RECORD).read_text())


def saved_dp(step: Path) -> int | None:
    """The DP a ZeRO-1 step was saved under: one optim/dp_rank_XX_* file per DP rank (None: no such files)."""
    optim = step / "optim"
    ranks = {int(m.group(1)) for p in optim.iterdir() if (m := DP_RANK_RE.match(p.name))} if optim.is_dir() else set()
    return max(ranks) + 1 if ranks else None


def dp_refusal(cfg: dict, ckpt_dir: Path) -> str | None:
    """Why the newest step cannot be resumed under this run's DP, or None. Under ZeRO-1 each DP rank saves its own
    slice of the optimizer state, and NxD's load_checkpoint (0.7-0.18, read) neither reshards nor checks it:
    another DP fails only inside the launched job (a missing dp_rank file, or slices of the wrong size). The
    step's own files say its DP (not our record: NxD's converter may have resharded them)."""
    from llmpipe.backends.neuron.layout import data_parallel

    steps = complete_steps(ckpt_dir)
    if cfg["parallel"].get("zero") != 1 or not steps:
        return None
    step, dp = ckpt_dir / f"step_{steps[-1]}", data_parallel(cfg["parallel"])
    saved = saved_dp(step)
    if saved is None or saved == dp:
        return None
    return (
        f"{step} holds ZeRO-1 optimizer state cut for data parallelism {saved}, but this run has DP {dp} "
        f"(parallel.nproc_per_node x nnodes / (tp x pp)); NxD loads it neither resharded nor checked. Resume on "
        f"the DP it was saved with, reshard the step's optim/ with NxD's nxd_convert_zero_checkpoints "
        f"--convert_to_sharded --dp_size {dp} (into another folder, then put it in place), or restart from the "
        "initial model (train: {resume: false})"
    )


def newest_state(root: Path) -> tuple[Path, dict] | None:
    """Backend.newest_state: `root` is <run>/checkpoints/neuron, NxD's checkpoint dir its nxd/."""
    return recorded(root / "nxd")


def prepare(cfg: dict, init_dir: Path, view_dir: Path, ckpt_dir: Path) -> None:
    """Before training is launched: refuse steps trained under another fingerprint (train.resume true), or
    remove every old step once (false: llmpipe.train.resume.begin_restart); then record this run's fingerprint."""
    from llmpipe.train.checkpoint import CheckpointError
    from llmpipe.train.resume import begin_restart, check_fingerprint, end_restart, fingerprint

    fp = fingerprint(cfg, init_dir, view_dir, **resume_sections(cfg))
    if not cfg["train"]["resume"]:
        begin_restart(ckpt_dir, fp)  # once: a retry of this restart resumes its steps (--loading_step latest_if_exists)
    else:
        end_restart(ckpt_dir)
        if (found := recorded(ckpt_dir)) is not None:
            check_fingerprint(found[1]["fingerprint"], fp, found[0], ckpt_dir)
        elif complete_steps(ckpt_dir):
            log.warning("%s: steps without %s (written before it was recorded): resumed unchecked", ckpt_dir, RECORD)
    if problem := dp_refusal(cfg, ckpt_dir):  # the steps left are the ones NxD resumes (a restart's retry too)
        raise CheckpointError(problem)
    write_json(ckpt_dir / RECORD, {"fingerprint": fp})
