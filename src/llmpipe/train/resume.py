"""What a checkpoint must agree on to be resumed, and the one-line answer when a rerun changed it.

Every trainer records `fingerprint(...)` in its checkpoints' trainer_state.json and resumes only a
checkpoint whose fingerprint equals the run's (`resume_state`). Snakemake deletes a job's old output
before running it again, so a changed hyperparameter is also caught when the workflow is parsed
(`changed_settings`), before any job: the newest complete checkpoint of the run records the settings it
was trained with, and they are compared here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from datetime import timedelta
from pathlib import Path

from llmpipe.io import sha256_file, write_json
from llmpipe.train.checkpoint import CheckpointError, complete_steps, newest_intact, step_dir

log = logging.getLogger(__name__)

# train.* keys that may change between a checkpoint and its resume without changing the result.
RESUME_NEUTRAL = {
    "launcher",
    "micro_batch_size",  # gradient accumulation only: the same rows per step (as a changed process count)
    "threads",
    "log_interval",
    "save_interval",
    "eval_interval",
    "keep_checkpoints",
    "resume",
    "skip_nonfinite_steps",
    "slurm_auto_resume",
    "prefetch",  # when rows are read, not which
    "compile",  # the same math, kernels fused (resuming eager <-> compiled is fine)
    "dist_timeout_minutes",
}
IDENTITY = ("init_sha256", "view")  # fingerprint entries that are not settings
RESTART = "restart.json"  # in a checkpoint root: the fingerprint of the train.resume false restart begun there


def train_settings(cfg: dict) -> dict:
    return {k: v for k, v in sorted(cfg["train"].items()) if k not in RESUME_NEUTRAL}


def init_sha256(init_dir: Path) -> str:
    """One digest over the initial model's weights (*.safetensors) and config.json, names included."""
    h = hashlib.sha256()
    for name in sorted(p.name for p in init_dir.glob("*.safetensors")) + ["config.json"]:
        h.update(name.encode())
        h.update(bytes.fromhex(sha256_file(init_dir / name)))  # streamed: a 5 GB shard is not read into memory
    return h.hexdigest()


HASH_TIMEOUT = timedelta(hours=2)  # the other ranks' wait while rank 0 reads the model: 282 GB (a 70B in float32) at 40 MB/s


def world_init_sha256(init_dir: Path) -> str:
    """init_sha256 read once per training world: in a torch.distributed world rank 0 reads the weights and the
    other ranks take its digest (each rank reading them all cost every rank the whole model, 280 GB for a 70B).
    Over a gloo group of its own with HASH_TIMEOUT: the world's collectives (NCCL: 10 minutes by default)
    could time out while rank 0 reads."""
    dist = sys.modules.get("torch.distributed")  # a trainer has it initialised by now; a launcher has no world
    if dist is None or not dist.is_initialized() or dist.get_world_size() == 1:
        return init_sha256(init_dir)
    group = dist.new_group(backend="gloo", timeout=HASH_TIMEOUT)
    try:
        box = [init_sha256(init_dir) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0, group=group)
    finally:
        dist.destroy_process_group(group)
    return box[0]


def fingerprint(cfg: dict, init_dir: Path, view_dir: Path, **sections: dict) -> dict:
    """What a checkpoint must agree on to be resumed: the train.* settings (RESUME_NEUTRAL left out), any
    backend `sections` (e.g. colossal= its parallel layout), the initial model and the data view."""
    view = json.loads((Path(view_dir) / "view.json").read_text())
    init = world_init_sha256(Path(init_dir))
    return {"train": train_settings(cfg), **sections, "init_sha256": init, "view": view["fingerprint"]}


def changed_keys(old: dict, new: dict) -> dict:
    """{key: (old, new)} for every setting two fingerprints disagree on; train keys bare, others `section.key`."""
    out = {}
    for part in sorted((set(old) | set(new)) - set(IDENTITY)):
        a, b = old.get(part, {}), new.get(part, {})
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                out[k if part == "train" else f"{part}.{k}"] = (a.get(k), b.get(k))
    return out


def check_fingerprint(old: dict, new: dict, path: Path, root: Path) -> None:
    """Raise CheckpointError naming what changed when checkpoint `path` was trained under another setup."""
    if old == new:
        return
    raise CheckpointError(
        f"checkpoint {path} belongs to a different training setup (changed keys: {changed_keys(old, new) or 'none'}; "
        f"init model same: {old.get('init_sha256') == new['init_sha256']}; data view same: "
        f"{old.get('view') == new['view']}). Its weights stay in {root} (nothing was deleted): train anew under "
        "another name (--config run=NEW), or restart this run from the initial model (train: {resume: false}; it "
        "replaces these checkpoints)"
    )


def begin_restart(root: Path, fp: dict) -> bool:
    """train.resume false, before training reads `root`: a restart from the initial model happens once.
    True: it begins now (the earlier run's step_* folders removed, then RESTART records `fp`); False: a
    restart under this fingerprint began here already, so this is its retry or rerun (a Slurm retry,
    --rerun-incomplete, auto-resume run the same command): it resumes its own checkpoints, never starts
    over again. Each backend's checkpoints are step_* folders under `root` (ours, NxD's)."""
    import shutil

    marker = root / RESTART
    if marker.is_file() and json.loads(marker.read_text()).get("fingerprint") == fp:
        log.info("train.resume is false: the restart recorded in %s goes on from its own checkpoints", marker)
        return False
    old = sorted(p for p in root.iterdir() if p.name.startswith("step_")) if root.is_dir() else []
    if old:
        log.info("train.resume is false: removing the earlier run's checkpoints in %s (%s)", root, ", ".join(p.name for p in old))
    for path in old:
        shutil.rmtree(path)
    root.mkdir(parents=True, exist_ok=True)
    write_json(marker, {"fingerprint": fp})
    return True


def end_restart(root: Path) -> None:
    """train.resume true again: a later resume false is a new restart."""
    (root / RESTART).unlink(missing_ok=True)


def resume_state(root: Path, t: dict, fp: dict, main: bool = True, barrier=lambda: None) -> tuple[Path, dict] | None:
    """(step folder, trainer_state.json) of the newest intact checkpoint to resume, checked against `fp`;
    None to start from the initial model (none there). Under train.resume false the main rank first
    begins the restart or finds it begun (`begin_restart`); `barrier`: the other ranks wait for that."""
    if t["resume"]:
        if main:
            end_restart(root)
    else:
        if main:
            begin_restart(root, fp)
        barrier()
    path = newest_intact(root)  # damaged steps are named and skipped
    if path is None:
        return None
    state = json.loads((path / "trainer_state.json").read_text())
    check_fingerprint(state["fingerprint"], fp, path, root)
    return path, state


def newest_state(root: Path) -> tuple[Path, dict] | None:
    """(step folder, trainer_state.json) of the newest complete checkpoint under `root`, or None."""
    for step in reversed(complete_steps(root)):
        state = step_dir(root, step) / "trainer_state.json"
        if state.is_file():
            return step_dir(root, step), json.loads(state.read_text())
    return None


WAYS_OUT = (
    "Keep them and train anew under another name (--config run=NEW), or restart this run from the initial "
    "model (train: {resume: false} in your --configfile; it replaces its checkpoints)"
)


def changed_inputs(root: Path, init_dir: Path, view_dir: Path, run: str) -> str | None:
    """One line when the run's newest checkpoint was trained from another initial model or data view than
    these (rule resume_check, a job of its own before training, so the old model is not deleted first)."""
    found = newest_state(root)
    if found is None or "fingerprint" not in found[1]:
        return None
    path, old = found[0], found[1]["fingerprint"]
    view = json.loads((Path(view_dir) / "view.json").read_text())["fingerprint"]
    changed = [
        what
        for what, same in (
            ("data view", old.get("view") == view),
            ("initial model", old.get("init_sha256") == init_sha256(Path(init_dir))),
        )
        if not same
    ]
    if not changed:
        return None
    return (
        f"run {run!r} has checkpoints ({path.name}) trained on another {' and another '.join(changed)} than this "
        f"run now has; nothing was deleted (the trained model is in {path.parent}). {WAYS_OUT}"
    )


def changed_settings(cfg: dict, root: Path, run: str, sections: dict | None = None, newest=None) -> str | None:
    """One line naming the train.* keys and backend `sections` keys (Backend.resume_sections: the layout)
    that differ from the run's newest checkpoint (`newest`: Backend.newest_state, default ours), with the
    two ways out; None when they agree, there is none, or train.resume is false."""
    found = (newest or newest_state)(root) if cfg["train"]["resume"] else None
    if found is None or "fingerprint" not in found[1]:
        return None
    path, state = found
    old = {k: v for k, v in state["fingerprint"].items() if k not in IDENTITY}
    diff = changed_keys(old, {"train": train_settings(cfg), **(sections or {})})
    if not diff:
        return None
    named = "; ".join(f"{k if '.' in k else f'train.{k}'} {a!r} -> {b!r}" for k, (a, b) in diff.items())
    return f"run {run!r} has checkpoints trained with other settings ({path.name}: {named}); nothing was deleted. {WAYS_OUT}"
