"""The colossal trainer's checkpoints: every rank writes its part into a temporary folder, then rank 0
seals it (llmpipe.train.checkpoint: sha256 of every file, then `done`) and renames it into place."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import torch.distributed as dist

from llmpipe.io import write_json
from llmpipe.model.hf_compat import legacy_readable
from llmpipe.train.checkpoint import prune, seal, step_dir

log = logging.getLogger(__name__)


def optimizer_name(sharded: bool) -> str:
    """ddp's optimizer is whole on every rank: one file (ColossalAI's sharded optimizer loader calls a
    device synchronize the CPU accelerator does not support). Others: ColossalAI's sharded folder."""
    return "optimizer" if sharded else "optimizer.bin"


class Saver:
    """Every rank writes its part into a temporary folder; rank 0 renames it into place (so a killed
    job never leaves a folder that looks complete) after a barrier."""

    def __init__(self, booster, rank: int, sharded: bool):
        self.booster, self.rank, self.sharded = booster, rank, sharded

    def _tmp(self, target: Path) -> Path:
        tmp = target.with_name(f".{target.name}.tmp")
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        return tmp

    def _publish(self, tmp: Path, target: Path) -> None:
        dist.barrier()
        if self.rank == 0:
            umask = os.umask(0)
            os.umask(umask)
            for p in [tmp, *tmp.rglob("*")]:  # safetensors writes 0600 files
                os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~umask)
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        dist.barrier()

    def checkpoint(self, root: Path, step: int, model, optimizer, scheduler, state: dict, keep: int) -> None:
        target = step_dir(root, step)
        tmp = self._tmp(target)
        self.booster.save_model(model, str(tmp / "model"), shard=True, use_safetensors=True)
        self.booster.save_optimizer(optimizer, str(tmp / optimizer_name(self.sharded)), shard=self.sharded)
        self.booster.save_lr_scheduler(scheduler, str(tmp / "scheduler.pt"))
        dist.barrier()
        if self.rank == 0:
            write_json(tmp / "trainer_state.json", {**state, "step": step})
            seal(tmp)  # sha256 of every file, then `done`
        self._publish(tmp, target)
        if self.rank == 0:
            prune(root, keep, step)
            log.info("checkpoint %s", target)

    def final(self, out: Path, model, hf_config, tokenizer_dir: Path | None, summary: dict, generation=None) -> None:
        """HF folder: ColossalAI writes the weights; config.json and generation_config.json (`generation`: the
        initial model's, as the torch trainer keeps it; else derived from the config) are written here
        (ColossalAI skips them under transformers 5.x), and the tokenizer is copied."""
        from transformers import GenerationConfig

        tmp = self._tmp(out)
        self.booster.save_model(model, str(tmp), shard=True, use_safetensors=True)
        dist.barrier()
        if self.rank == 0:
            hf_config.save_pretrained(str(tmp))
            (generation or GenerationConfig.from_model_config(hf_config)).save_pretrained(str(tmp))
            if tokenizer_dir is not None:
                for f in tokenizer_dir.iterdir():
                    if f.is_file() and not f.name.startswith("."):
                        shutil.copy2(f, tmp / f.name)
            legacy_readable(tmp)  # 4.x readers of this folder get the same RoPE and tokenizer class
            write_json(tmp / "train_summary.json", summary)
        self._publish(tmp, out)
