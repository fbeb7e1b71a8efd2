"""torch-train (torch backend): AdamW + warmup/cosine, grad clipping and accumulation, bf16 autocast where
supported, resumable checkpoints, periodic validation, JSONL metrics. Runs alone or under torchrun (DDP).

  python -m llmpipe torch-train --config C --init DIR --data VIEW --checkpoints DIR --metrics F --out DIR
  torchrun --standalone --nproc_per_node 2 -m llmpipe torch-train ...

The recipe (loss, optimizer groups, schedule, resume fingerprint, metrics, step loop, checkpoint steps)
is llmpipe.train's, shared with the colossal trainer; here: the process group, DDP, autocast and the
torch checkpoint files.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import torch
import torch.distributed as dist

from llmpipe import config as cfgmod
from llmpipe.backends.torch import checkpoint as ckpt
from llmpipe.io import atomic_path, write_json
from llmpipe.train.batching import Sampler, grad_accum_steps
from llmpipe.train.checkpoint import CheckpointError
from llmpipe.train.cli import trainer_parser
from llmpipe.train.guard import NonFiniteError, NonFiniteGuard
from llmpipe.train.loop import StepLoop
from llmpipe.train.loss import dataset_loss, label_count, lm_loss_sum
from llmpipe.train.metrics import MetricsWriter
from llmpipe.train.optim import build_optimizer
from llmpipe.train.resume import fingerprint, resume_state
from llmpipe.train.view import load_view

log = logging.getLogger(__name__)


class Dist:
    """Process group facts; a single process is world size 1."""

    def __init__(self):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = torch.device(f"cuda:{local}") if torch.cuda.is_available() else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if self.world > 1:
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            value = value.clone()
            dist.all_reduce(value)
        return value

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def close(self) -> None:
        if self.world > 1:
            dist.destroy_process_group()


def autocast_dtype(precision: str, device: torch.device):
    if precision == "bf16" or (precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported()):
        return torch.bfloat16
    return None


def load_model(init_dir: Path, device: torch.device):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(init_dir), dtype=torch.float32, attn_implementation="sdpa", trust_remote_code=False
    ).to(device)
    model.train()
    return model


class Trainer:
    """One torch training run: setup here, steps driven by llmpipe.train.loop.StepLoop."""

    def __init__(self, cfg: dict, init_dir: Path, data_dir: Path, ckpt_root: Path):
        self.cfg, self.t, self.ckpt_root = cfg, cfg["train"], ckpt_root
        t = self.t
        torch.set_num_threads(t["threads"])
        self.env = Dist()
        self.accum = grad_accum_steps(t["global_batch_size"], t["micro_batch_size"], self.env.world)
        self.amp = autocast_dtype(t["precision"], self.env.device)
        self.train_ds, self.val_ds = (ds.with_format("torch") for ds in load_view(data_dir, t))
        self.sampler = Sampler(len(self.train_ds), t["seed"])
        torch.manual_seed(t["seed"])
        self.model = load_model(init_dir, self.env.device)
        self.optimizer, self.scheduler = build_optimizer(self.model, t)
        self.fp = fingerprint(cfg, init_dir, data_dir)
        self.guard = NonFiniteGuard(t["skip_nonfinite_steps"])
        self.ddp = None

    def resume(self) -> int:
        """Restore the newest intact checkpoint of this setup (weights, optimizer, schedule, RNG); its step."""
        found = resume_state(self.ckpt_root, self.t, self.fp, self.env.main)
        if found is None:
            return 0
        start = ckpt.load(found[0], self.model, self.optimizer, self.scheduler)["step"]
        log.info("resumed from %s (step %d)", found[0], start)
        return start

    def distribute(self) -> None:
        """DDP over the process group, once the resumed weights are in place."""
        if self.env.world > 1:
            self.ddp = torch.nn.parallel.DistributedDataParallel(self.model)
        if self.env.main:
            log.info(
                "world %d, micro batch %d, grad accumulation %d, global batch %d, precision %s, %d parameters",
                self.env.world,
                self.t["micro_batch_size"],
                self.accum,
                self.t["global_batch_size"],
                self.amp or "fp32",
                self.model.num_parameters(),
            )

    def autocast(self):
        return torch.autocast(self.env.device.type, dtype=self.amp or torch.bfloat16, enabled=self.amp is not None)

    def train_step(self, step: int) -> tuple[float, float, float]:
        t, env = self.t, self.env
        micro = self.sampler.micro_batches(step, t["global_batch_size"], t["micro_batch_size"], env.rank, env.world)
        batches = [self.train_ds[ids.tolist()] for ids in micro]
        global_count = env.sum(torch.tensor(float(label_count(batches)), device=env.device))
        loss_sum = self.forward_backward(batches, global_count)
        max_norm = t["grad_clip"] if t["grad_clip"] > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        lr = self.optimizer.param_groups[0]["lr"]
        loss = float(env.sum(loss_sum) / global_count)  # the same on every rank (all-reduced), as is grad_norm
        if self.guard.ok(step + 1, loss, grad_norm):
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss, lr, grad_norm

    def forward_backward(self, batches: list[dict], global_count: torch.Tensor) -> torch.Tensor:
        """Gradients of the global token-mean loss from this rank's micro batches; their loss sum."""
        net, device = self.ddp or self.model, self.env.device
        loss_sum = torch.zeros((), device=device)
        for i, batch in enumerate(batches):
            last = self.ddp is None or i == len(batches) - 1
            with contextlib.nullcontext() if last else self.ddp.no_sync(), self.autocast():
                part, _ = lm_loss_sum(net, batch["input_ids"].to(device), batch["labels"].to(device))
                # DDP averages gradients over ranks; scale so the result is the global token mean.
                (part * self.env.world / global_count).backward()
            loss_sum += part.detach()
        return loss_sum

    def evaluate(self) -> tuple[float, int]:
        return dataset_loss(self.model, self.val_ds, self.cfg["eval"]["batch_size"], self.env.device, self.amp)

    def validate(self) -> tuple[float, int] | None:
        """Validation on the main rank (the model is whole on every rank)."""
        val = self.evaluate() if self.env.main else None
        self.env.barrier()
        return val

    def save(self, step: int) -> None:
        if self.env.main:
            ckpt.save(
                self.ckpt_root,
                step,
                self.model,
                self.optimizer,
                self.scheduler,
                {"fingerprint": self.fp},
                self.t["keep_checkpoints"],
            )
        self.env.barrier()

    def finish(self, out_dir: Path, start: int, last_val: float | None) -> dict:
        """The final HF folder with train_summary.json (main rank); the summary."""
        summary = {
            "steps": self.t["max_steps"],
            "final_val_loss": last_val,
            "world_size": self.env.world,
            "precision": str(self.amp or "fp32"),
            "resumed_from_step": start,
        }
        if not self.env.main:
            return summary
        if last_val is None:  # resumed at max_steps: nothing left to train, still report validation
            summary["final_val_loss"], _ = self.evaluate()
        with atomic_path(out_dir) as tmp:
            self.model.save_pretrained(str(tmp))
            write_json(tmp / "train_summary.json", summary)
        log.info("trained model -> %s (final val_loss %.4f)", out_dir, summary["final_val_loss"])
        return summary


def train(cfg: dict, init_dir, data_dir, ckpt_root, metrics_path, out_dir, stop_after: int | None = None) -> dict | None:
    trainer = Trainer(cfg, Path(init_dir), Path(data_dir), Path(ckpt_root))
    start = trainer.resume()
    trainer.distribute()
    metrics = MetricsWriter(Path(metrics_path), start, trainer.env.main, tensorboard=True)
    stopped, last_val = StepLoop(trainer.t, trainer.sampler, start, metrics, trainer.env.main).run(trainer, stop_after)
    summary = None if stopped else trainer.finish(Path(out_dir), start, last_val)
    metrics.close()
    if not stopped:
        trainer.env.barrier()
    trainer.env.close()
    return summary


def main(argv: list[str] | None = None) -> None:
    args = trainer_parser("llmpipe torch-train", __doc__).parse_args(argv)
    try:
        train(cfgmod.load(args.config), args.init, args.data, args.checkpoints, args.metrics, args.out, args.stop_after)
    except (NonFiniteError, CheckpointError) as exc:
        raise SystemExit(f"llmpipe torch-train: {exc}") from None
