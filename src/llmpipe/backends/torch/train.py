"""train (torch backend): AdamW + warmup/cosine, grad clipping and accumulation, bf16 autocast where
supported, resumable checkpoints, periodic validation, JSONL metrics. Runs alone or under torchrun (DDP).

  python -m llmpipe train --config C --init DIR --data VIEW --checkpoints DIR --metrics F --out DIR
  torchrun --standalone --nproc_per_node 2 -m llmpipe train ...
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from llmpipe import config as cfgmod
from llmpipe.backends.torch import checkpoint as ckpt
from llmpipe.io import atomic_path, write_json
from llmpipe.train.batching import Sampler, grad_accum_steps
from llmpipe.train.loss import dataset_loss, lm_loss_sum
from llmpipe.train.resume import RESUME_NEUTRAL
from llmpipe.train.guard import NonFiniteError, NonFiniteGuard
from llmpipe.train.schedule import lr_at
from llmpipe.io import dumps as io_dumps

log = logging.getLogger(__name__)



def fingerprint(cfg: dict, init_dir: Path, view_dir: Path) -> dict:
    """What a checkpoint must agree on to be resumed."""
    h = hashlib.sha256()
    for name in sorted(p.name for p in init_dir.glob("*.safetensors")) + ["config.json"]:
        h.update(name.encode())
        h.update(hashlib.sha256((init_dir / name).read_bytes()).digest())
    view = json.loads((view_dir / "view.json").read_text())
    return {
        "train": {k: v for k, v in sorted(cfg["train"].items()) if k not in RESUME_NEUTRAL},
        "init_sha256": h.hexdigest(),
        "view": view["fingerprint"],
    }


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


def build_optimizer(model, t: dict):
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": t["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"],
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_at(s, t["lr"], t["min_lr"], t["warmup_steps"], t["max_steps"]) / t["lr"]
    )
    return opt, sched


def _step_of(line: str) -> float:
    """A metrics line's step; a line cut short by a kill (or empty) counts as after every step."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return float("inf")


class Metrics:
    """metrics.jsonl (+ TensorBoard when installed), written by rank 0 only."""

    def __init__(self, path: Path, resume_step: int, enabled: bool):
        self.path, self.enabled, self.tb = path, enabled, None
        if not enabled:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if path.exists():  # drop what a killed run logged after the checkpoint we resume from
            kept = [line for line in path.read_text().splitlines() if _step_of(line) <= resume_step]
        with atomic_path(path) as tmp:
            tmp.write_text("".join(line + "\n" for line in kept))
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(path.parent / "tensorboard"))
        except ImportError:
            log.info("tensorboard not installed: metrics go to %s only", path)

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as fh:
            fh.write(io_dumps(record) + "\n")
        if self.tb:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.tb.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self.tb:
            self.tb.close()


def train(cfg: dict, init_dir, data_dir, ckpt_root, metrics_path, out_dir, stop_after: int | None = None) -> dict | None:
    import datasets
    from transformers import AutoModelForCausalLM

    t = cfg["train"]
    init_dir, data_dir, ckpt_root, out_dir = map(Path, (init_dir, data_dir, ckpt_root, out_dir))
    torch.set_num_threads(t["threads"])
    env = Dist()
    accum = grad_accum_steps(t["global_batch_size"], t["micro_batch_size"], env.world)
    amp = autocast_dtype(t["precision"], env.device)
    train_ds = datasets.load_from_disk(str(data_dir / "train")).with_format("torch")
    val_ds = datasets.load_from_disk(str(data_dir / "val")).with_format("torch")
    if len(train_ds[0]["input_ids"]) != t["seq_len"]:
        raise ValueError(f"view {data_dir} has rows of {len(train_ds[0]['input_ids'])} tokens, train.seq_len is {t['seq_len']}")
    if t["global_batch_size"] > len(train_ds):
        log.warning("train.global_batch_size %d exceeds the %d train rows: every step repeats rows (%.2f epochs per "
                    "step); use more data or a smaller batch", t["global_batch_size"], len(train_ds),
                    t["global_batch_size"] / len(train_ds))
    sampler = Sampler(len(train_ds), t["seed"])

    torch.manual_seed(t["seed"])
    model = AutoModelForCausalLM.from_pretrained(
        str(init_dir), dtype=torch.float32, attn_implementation="sdpa", trust_remote_code=False
    ).to(env.device)
    model.train()
    optimizer, scheduler = build_optimizer(model, t)
    fp = fingerprint(cfg, init_dir, data_dir)

    start = 0
    path = ckpt.newest_intact(ckpt_root) if t["resume"] else None  # damaged steps are named and skipped
    if path is not None:
        state = json.loads((path / "trainer_state.json").read_text())
        if state["fingerprint"] != fp:
            changed = {k: (state["fingerprint"]["train"].get(k), v) for k, v in fp["train"].items()
                       if state["fingerprint"]["train"].get(k) != v}
            raise ckpt.CheckpointError(
                f"checkpoint {path} belongs to a different training setup (changed train keys: {changed or 'none'}; "
                f"init model same: {state['fingerprint']['init_sha256'] == fp['init_sha256']}; data view same: "
                f"{state['fingerprint']['view'] == fp['view']}). Delete {ckpt_root} to start over, or set train.resume: false."
            )
        start = ckpt.load(path, model, optimizer, scheduler)["step"]
        log.info("resumed from %s (step %d)", path, start)
    elif env.main and ckpt.complete_steps(ckpt_root):
        log.info("train.resume is false: ignoring checkpoints in %s", ckpt_root)

    ddp = torch.nn.parallel.DistributedDataParallel(model) if env.world > 1 else None
    net = ddp or model
    metrics = Metrics(Path(metrics_path), start, env.main)
    if env.main:
        log.info("world %d, micro batch %d, grad accumulation %d, global batch %d, precision %s, %d parameters",
                 env.world, t["micro_batch_size"], accum, t["global_batch_size"], amp or "fp32", model.num_parameters())

    last_val = None
    guard = NonFiniteGuard(t["skip_nonfinite_steps"])
    tokens_per_step = t["global_batch_size"] * t["seq_len"]
    clock = time.perf_counter()
    for step in range(start, t["max_steps"]):
        micro = sampler.micro_batches(step, t["global_batch_size"], t["micro_batch_size"], env.rank, env.world)
        batches = [train_ds[ids.tolist()] for ids in micro]
        local_count = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
        global_count = env.sum(torch.tensor(float(local_count), device=env.device))
        loss_sum = torch.zeros((), device=env.device)
        for i, batch in enumerate(batches):
            sync = contextlib.nullcontext() if ddp is None or i == len(batches) - 1 else ddp.no_sync()
            with sync, torch.autocast(env.device.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
                part, _ = lm_loss_sum(net, batch["input_ids"].to(env.device), batch["labels"].to(env.device))
                # DDP averages gradients over ranks; scale so the result is the global token mean.
                (part * env.world / global_count).backward()
            loss_sum += part.detach()
        max_norm = t["grad_clip"] if t["grad_clip"] > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        lr = optimizer.param_groups[0]["lr"]
        loss = float(env.sum(loss_sum) / global_count)  # the same on every rank (all-reduced), as is grad_norm
        if guard.ok(step + 1, loss, float(grad_norm)):
            optimizer.step()
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        done = step + 1
        elapsed = time.perf_counter() - clock
        record = {"step": done, "loss": loss, "lr": lr, "grad_norm": float(grad_norm),
                  "tokens": done * tokens_per_step, "epoch": sampler.epoch_of(done, t["global_batch_size"]),
                  "tokens_per_s": (done - start) * tokens_per_step / max(elapsed, 1e-9)}
        if done % t["eval_interval"] == 0 or done == t["max_steps"]:
            if env.main:
                val_loss, val_tokens = dataset_loss(model, val_ds, cfg["eval"]["batch_size"], env.device, amp)
                record.update(val_loss=val_loss, val_tokens=val_tokens)
                last_val = val_loss
            env.barrier()
        metrics.write(record)
        if env.main and (done % t["log_interval"] == 0 or done == t["max_steps"] or "val_loss" in record):
            log.info("step %d/%d loss %.4f lr %.2e grad_norm %.3f %.0f tok/s%s", done, t["max_steps"], loss, lr,
                     record["grad_norm"], record["tokens_per_s"],
                     f" val_loss {record['val_loss']:.4f}" if "val_loss" in record else "")
        if done % t["save_interval"] == 0 or done == t["max_steps"] or done == stop_after:
            if env.main:
                ckpt.save(ckpt_root, done, model, optimizer, scheduler, {"fingerprint": fp}, t["keep_checkpoints"])
            env.barrier()
        if done == stop_after and done < t["max_steps"]:
            log.info("stopping after step %d as asked (--stop-after); rerun to resume", done)
            metrics.close()
            env.close()
            return None

    summary = {"steps": t["max_steps"], "final_val_loss": last_val, "world_size": env.world,
               "precision": str(amp or "fp32"), "resumed_from_step": start}
    if env.main:
        if last_val is None:  # resumed at max_steps: nothing left to train, still report validation
            last_val, _ = dataset_loss(model, val_ds, cfg["eval"]["batch_size"], env.device, amp)
            summary["final_val_loss"] = last_val
        with atomic_path(out_dir) as tmp:
            model.save_pretrained(str(tmp))
            write_json(tmp / "train_summary.json", summary)
        log.info("trained model -> %s (final val_loss %.4f)", out_dir, last_val)
    metrics.close()
    env.barrier()
    env.close()
    return summary


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--init", required=True, help="initial HF checkpoint folder")
    p.add_argument("--data", required=True, help="hf view folder (train/, val/, view.json)")
    p.add_argument("--checkpoints", required=True, help="folder for resumable step_* checkpoints")
    p.add_argument("--metrics", required=True, help="metrics.jsonl path")
    p.add_argument("--out", required=True, help="final HF-format model folder")
    p.add_argument("--stop-after", type=int, default=None,
                   help="checkpoint after this step and exit without --out (as if preempted)")
    args = p.parse_args(argv)
    try:
        train(cfgmod.load(args.config), args.init, args.data, args.checkpoints, args.metrics, args.out, args.stop_after)
    except (NonFiniteError, ckpt.CheckpointError) as exc:
        raise SystemExit(f"llmpipe train: {exc}") from None
