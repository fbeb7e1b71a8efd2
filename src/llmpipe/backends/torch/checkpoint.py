"""The torch trainer's checkpoint contents: step_XXXXXXXX/ with model (safetensors and config.json: a
Hugging Face model folder `llmpipe export` takes), optimizer, scheduler, RNG and the trainer state (step,
fingerprint). Steps, sealing, verification and pruning are the shared
llmpipe.train.checkpoint's; this module builds a step under a temporary name, seals it, renames it into
place, and restores it.

Under FSDP2 (parallel.zero 3) weights and optimizer state are sharded: `save_sharded` writes them with
torch.distributed.checkpoint (DCP) into dcp/ (every rank its shards, rank 0 the metadata), beside the
same scheduler.pt, rng.pt and trainer_state.json ("format": "dcp"); `load_sharded` reads them back on
any number of processes (DCP reshards on load).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model

from llmpipe.io import atomic_path
from llmpipe.model.hf_compat import legacy_readable
from llmpipe.train.checkpoint import prune, seal, step_dir
from llmpipe.train.optim import kernel_kept

log = logging.getLogger(__name__)


def save(root: Path, step: int, model, optimizer, scheduler, state: dict, keep: int) -> Path:
    target = step_dir(root, step)
    with atomic_path(target) as tmp:
        tmp.mkdir(parents=True)
        save_model(model, str(tmp / "model.safetensors"))  # handles tied (shared) weights
        if getattr(model, "config", None) is not None:  # a transformers model: the step is a model folder too
            model.config.to_json_file(tmp / "config.json")
            legacy_readable(tmp)
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        _seal(tmp, step, scheduler, state)
    _published(root, target, step, keep, "")
    return target


def load(path: Path, model, optimizer, scheduler) -> dict:
    """Restore everything saved by `save` (tensors only: weights_only=True) and return the trainer state."""
    load_model(model, str(path / "model.safetensors"), strict=True)
    with kernel_kept(optimizer):
        # on the CPU: saved from rank 0's GPU, it would otherwise load on that GPU in every rank (load_state_dict
        # moves each state to its parameter's device)
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True))
    return _load_rest(path, scheduler)


def _seal(folder: Path, step: int, scheduler, state: dict) -> None:
    """Both save paths' last step under the temporary name: scheduler, RNG and trainer state beside the
    weights, then the checksums (llmpipe.train.checkpoint.seal) that make the step complete."""
    torch.save(scheduler.state_dict(), folder / "scheduler.pt")
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(rng, folder / "rng.pt")
    (folder / "trainer_state.json").write_text(json.dumps({**state, "step": step}, indent=2, sort_keys=True))
    seal(folder)


def _published(root: Path, target: Path, step: int, keep: int, how: str) -> None:
    """After the rename into place: steps pruned (llmpipe.train.checkpoint.prune), the step logged."""
    prune(root, keep, step)
    log.info("checkpoint %s%s", target, how)


def _load_rest(folder: Path, scheduler) -> dict:
    """What _seal wrote: the scheduler and RNG restored, the trainer state returned."""
    scheduler.load_state_dict(torch.load(folder / "scheduler.pt", map_location="cpu", weights_only=True))
    rng = torch.load(folder / "rng.pt", map_location="cpu", weights_only=True)
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and torch.cuda.is_available():  # as many GPUs as both the saving host and this one see
        for device, state in enumerate(rng["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state, device)
    return json.loads((folder / "trainer_state.json").read_text())


def save_sharded(root: Path, step: int, model, optimizer, scheduler, state: dict, keep: int, main: bool) -> Path:
    """A step of an FSDP2 run (collective: every rank calls it): DCP shards in dcp/, the rest by rank 0;
    sealed and renamed into place by rank 0 like `save`."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    target = step_dir(root, step)
    tmp = target.with_name(f".{target.name}.tmp-dcp")
    if main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(tmp / "dcp"))
    dist.barrier()
    if main:
        _seal(tmp, step, scheduler, {**state, "format": "dcp"})
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
        _published(root, target, step, keep, f" (DCP, {dist.get_world_size()} processes)")
    dist.barrier()
    return target


def is_sharded(path: Path) -> bool:
    return (path / "dcp").is_dir()


def load_sharded(path: Path, model, optimizer, scheduler) -> dict:
    """Restore a `save_sharded` step into an FSDP2 model and its optimizer on this run's processes."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=str(path / "dcp"))
    with kernel_kept(optimizer):
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    return _load_rest(path, scheduler)
