"""torch-train (torch backend): AdamW + warmup/cosine, grad clipping and accumulation, bf16 autocast where
supported, resumable checkpoints, periodic validation, JSONL metrics. Runs alone or under torchrun:
DDP (parallel.zero 0) or FSDP2 (parallel.zero 3, torch.distributed.fsdp.fully_shard, DCP checkpoints
that resume on any number of processes; one process is not sharded), with activation checkpointing (parallel.activation_checkpointing),
document masking of packed rows (train.document_masking), torch.compile (train.compile) and rows read
by a background thread while the step runs (train.prefetch; the wait is the metric data_wait_s).

  python -m llmpipe torch-train --config C --init DIR --data VIEW --checkpoints DIR --metrics F --out DIR
  torchrun --standalone --nproc_per_node 2 -m llmpipe torch-train ...

The recipe (loss, optimizer groups, schedule, resume fingerprint, metrics, step loop, checkpoint steps)
is llmpipe.train's, shared with the colossal trainer; here: the process group, DDP / FSDP2, autocast and
the torch checkpoint files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from llmpipe import config as cfgmod
from llmpipe.backends.torch import BACKEND
from llmpipe.backends.torch import checkpoint as ckpt
from llmpipe.io import atomic_path, write_json
from llmpipe.model.folder import model_folder
from llmpipe.model.hf_compat import legacy_readable
from llmpipe.train.batching import Sampler, grad_accum_steps
from llmpipe.train.checkpoint import CheckpointError
from llmpipe.train.cli import trainer_parser
from llmpipe.train.documents import SDPA, attention_kernel, masking_wanted, model_inputs
from llmpipe.train.guard import NonFiniteError, NonFiniteGuard
from llmpipe.train.lock import trainer_lease
from llmpipe.train.loop import StepLoop
from llmpipe.train.loss import dataset_loss, label_count, lm_loss_sum
from llmpipe.train.metrics import MetricsWriter
from llmpipe.train.optim import build_optimizer
from llmpipe.train.prefetch import Prefetcher
from llmpipe.train.resume import fingerprint, resume_state
from llmpipe.train.throughput import throughput_of
from llmpipe.train.view import load_view

log = logging.getLogger(__name__)


class Dist:
    """Process group facts; a single process is world size 1."""

    def __init__(self, group: bool = False, timeout_minutes: int | None = None):
        """`group`: a process group even for one process (FSDP2 and DCP need one); `timeout_minutes`: its
        collectives' timeout (train.dist_timeout_minutes; None: torch's default)."""
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = torch.device(f"cuda:{local}") if torch.cuda.is_available() else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.grouped = self.world > 1 or group
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        timeout = {"timeout": timedelta(minutes=timeout_minutes)} if timeout_minutes else {}
        if self.world > 1:
            dist.init_process_group(backend, **timeout)
        elif group:  # one process, not under torchrun: a group of one on a free local port
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, **timeout)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            value = value.clone()
            dist.all_reduce(value)
        return value

    def barrier(self) -> None:
        if self.grouped:
            dist.barrier()

    def close(self) -> None:
        if self.grouped:
            dist.destroy_process_group()


def autocast_dtype(precision: str, device: torch.device):
    if precision == "bf16" or (precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported()):
        return torch.bfloat16
    return None


def load_model(init_dir: Path, device: torch.device, activation_checkpointing: bool = False, attention: str = SDPA):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_folder(init_dir, "--init"),
        dtype=torch.float32,
        attn_implementation=attention,
        trust_remote_code=False,
        local_files_only=True,
    ).to(device)
    if activation_checkpointing:  # recompute each decoder layer in backward (non-reentrant: DDP, FSDP2, compile)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def fully_shard_model(model, amp) -> None:
    """FSDP2: each decoder layer its own unit (gathered just before it runs), the rest (embeddings, final
    norm, head) the root's. bf16 precision: bf16 parameters in compute, gradients reduced in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if amp is not None else None
    kwargs = {"mp_policy": mp} if mp is not None else {}
    for layer in model.model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)


def compile_wanted(setting, device: torch.device) -> bool:
    """train.compile (auto | true | false): auto = on CUDA, off elsewhere."""
    return setting is True or (setting == "auto" and device.type == "cuda")


def compile_layers(model) -> None:
    """torch.compile each decoder layer in place (torchtitan's per-block compile): the layers share one
    compiled graph, so compile time does not grow with depth, and module names (state dicts,
    checkpoints) stay as they are. Works under DDP and FSDP2 alike; embeddings and the head stay eager."""
    for layer in model.model.layers:
        layer.compile()


def full_norm(norm) -> float:
    """A gradient norm as a float (FSDP2's is a DTensor: its full value)."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


class Trainer:
    """One torch training run: setup here, steps driven by llmpipe.train.loop.StepLoop."""

    def __init__(self, cfg: dict, init_dir: Path, data_dir: Path, ckpt_root: Path):
        self.cfg, self.t, self.ckpt_root = cfg, cfg["train"], ckpt_root
        t, par = self.t, cfg.get("parallel", {})
        self.fsdp = (par.get("zero") or 0) == 3
        torch.set_num_threads(t["threads"])
        self.env = Dist(group=self.fsdp, timeout_minutes=t.get("dist_timeout_minutes"))
        # zero 3 on one process: nothing to shard, and FSDP2 of one ran at 0.66x DDP (H100, micro 1): a plain
        # module. Its checkpoints stay DCP (resumable on any number of processes), its fingerprint zero 3.
        self.shard = self.fsdp and self.env.world > 1
        self.accum = grad_accum_steps(t["global_batch_size"], t["micro_batch_size"], self.env.world)
        self.amp = autocast_dtype(t["precision"], self.env.device)
        self.train_ds, self.val_ds = (ds.with_format("torch") for ds in load_view(data_dir, t))
        self.masking = masking_wanted(t["document_masking"], self.train_ds.column_names)
        self.sampler = Sampler(len(self.train_ds), t["seed"])
        torch.manual_seed(t["seed"])
        self.attention = attention_kernel(self.env.device, self.masking)
        self.compile = compile_wanted(t["compile"], self.env.device)
        self.model = load_model(init_dir, self.env.device, bool(par.get("activation_checkpointing")), self.attention)
        if self.shard:  # shard before the optimizer sees the parameters (it holds the shards)
            fully_shard_model(self.model, self.amp)
        self.optimizer, self.scheduler = build_optimizer(self.model, t)
        self.fp = fingerprint(cfg, init_dir, data_dir, **BACKEND.resume_sections(cfg))
        self.guard = NonFiniteGuard(t["skip_nonfinite_steps"])
        self.ddp = None
        self.net = self.model  # what the training forward calls: DDP's wrapper and/or the compiled module
        self.rows: Prefetcher | None = None
        self.data_wait_s = self.step_s = 0.0

    @property
    def plain_parallel(self) -> str:
        """Without zero 3: DDP over several processes, else one process (it was called DDP too)."""
        return "DDP" if self.env.world > 1 else "none (1 process)"

    def resume(self) -> int:
        """Restore the newest intact checkpoint of this setup (weights, optimizer, schedule, RNG); its step."""
        found = resume_state(self.ckpt_root, self.t, self.fp, self.env.main, self.env.barrier)
        if found is None:
            return 0
        self.guard.restore(found[1])
        if ckpt.is_sharded(found[0]):
            start = ckpt.load_sharded(found[0], self.model, self.optimizer, self.scheduler)["step"]
        else:
            start = ckpt.load(found[0], self.model, self.optimizer, self.scheduler)["step"]
        log.info("resumed from %s (step %d)", found[0], start)
        return start

    def distribute(self) -> None:
        """DDP over the process group (FSDP2 is in place already), once the resumed weights are in place;
        torch.compile of the decoder layers (train.compile)."""
        if self.env.world > 1 and not self.fsdp:
            self.ddp = torch.nn.parallel.DistributedDataParallel(self.model)
        self.net = self.ddp or self.model
        if self.compile:
            compile_layers(self.model)
        if self.env.main:
            log.info(
                "world %d (%s), micro batch %d, grad accumulation %d, global batch %d, precision %s, %d parameters, "
                "document masking %s, attention %s, compile %s, activation checkpointing %s, prefetch %d",
                self.env.world,
                "FSDP2" if self.shard else "zero 3 with 1 process: not sharded" if self.fsdp else self.plain_parallel,
                self.t["micro_batch_size"],
                self.accum,
                self.t["global_batch_size"],
                self.amp or "fp32",
                sum(p.numel() for p in self.model.parameters()),  # an FSDP2 DTensor's numel is its full size
                "on" if self.masking else "off",
                self.attention,
                ("on" if self.compile else "off") + (" (auto)" if self.t["compile"] == "auto" else ""),
                "on" if bool(self.cfg.get("parallel", {}).get("activation_checkpointing")) else "off",
                self.t["prefetch"],
            )

    def read_rows(self, step: int) -> tuple[list[dict], int]:
        """This rank's micro batches of `step` and their labelled positions (the prefetch thread's job)."""
        t, env = self.t, self.env
        micro = self.sampler.micro_batches(step, t["global_batch_size"], t["micro_batch_size"], env.rank, env.world)
        batches = [self.train_ds[ids.tolist()] for ids in micro]
        return batches, label_count(batches)

    def start_reading(self, start: int) -> None:
        self.rows = Prefetcher(self.read_rows, start, self.t["max_steps"], self.t["prefetch"])

    def step_metrics(self) -> dict:
        """Extra fields of this step's metrics record (llmpipe.train.loop): seconds waiting for rows, and the
        whole step's seconds (their ratio is the share of the step spent waiting on data)."""
        return {"data_wait_s": round(self.data_wait_s, 6), "step_s": round(self.step_s, 6)}

    def autocast(self):
        return torch.autocast(self.env.device.type, dtype=self.amp or torch.bfloat16, enabled=self.amp is not None)

    def train_step(self, step: int) -> tuple[float, float, float]:
        t, env = self.t, self.env
        begin = time.perf_counter()
        if self.rows is None:
            self.start_reading(step)
        batches, count = self.rows.get(step)
        self.data_wait_s = self.rows.wait_s
        global_count = env.sum(torch.tensor(float(count), device=env.device))
        loss_sum = self.forward_backward(batches, global_count)
        max_norm = t["grad_clip"] if t["grad_clip"] > 0 else float("inf")
        grad_norm = full_norm(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        lr = self.optimizer.param_groups[0]["lr"]
        loss = float(env.sum(loss_sum) / global_count)  # the same on every rank (all-reduced), as is grad_norm
        if self.guard.ok(step + 1, loss, grad_norm):
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step_s = time.perf_counter() - begin
        return loss, lr, grad_norm

    def forward_backward(self, batches: list[dict], global_count: torch.Tensor) -> torch.Tensor:
        """Gradients of the global token-mean loss from this rank's micro batches; their loss sum."""
        device = self.env.device
        loss_sum = torch.zeros((), device=device)
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            if self.shard:  # reduce-scatter gradients only after the last micro batch
                self.model.set_requires_gradient_sync(last)
            sync = contextlib.nullcontext() if last or self.ddp is None else self.ddp.no_sync()
            with sync, self.autocast():
                inputs = model_inputs(batch, device, self.masking, self.attention)
                part, _ = lm_loss_sum(self.net, labels=batch["labels"].to(device), compiled=self.compile, **inputs)
                # DDP and FSDP2 average gradients over ranks; scale so the result is the global token mean.
                (part * self.env.world / global_count).backward()
            loss_sum += part.detach()
        return loss_sum

    def evaluate(self) -> tuple[float, int]:
        """The validation loss, its rows shared among the processes (each scores every world-th row; the sums
        all-reduced): under DDP the other ranks no longer wait in a barrier, past the process group's
        timeout on a large split, while rank 0 scores all of it."""
        e = self.cfg["eval"]
        return dataset_loss(
            self.model,
            self.val_ds,
            e["batch_size"],
            self.env.device,
            self.amp,
            document_masking=self.masking,
            share=(self.env.rank, self.env.world),
            reduce=(lambda pair: self.env.sum(pair.to(self.env.device)).cpu()) if self.env.world > 1 else None,
            max_batches=e["max_batches"],
        )

    def validate(self) -> tuple[float, int]:
        """Validation on every rank (the same result on each)."""
        return self.evaluate()

    def save(self, step: int) -> None:
        state = {"fingerprint": self.fp, **self.guard.state()}
        if self.fsdp:
            ckpt.save_sharded(
                self.ckpt_root,
                step,
                self.model,
                self.optimizer,
                self.scheduler,
                {**state, "world_size": self.env.world},
                self.t["keep_checkpoints"],
                self.env.main,
            )
            return
        if self.env.main:
            ckpt.save(self.ckpt_root, step, self.model, self.optimizer, self.scheduler, state, self.t["keep_checkpoints"])
        self.env.barrier()

    def finish(self, out_dir: Path, start: int, last_val: float | None) -> dict:
        """The final HF folder with train_summary.json (main rank); the summary."""
        summary = {
            "steps": self.t["max_steps"],
            "final_val_loss": last_val,
            "world_size": self.env.world,
            "precision": str(self.amp or "fp32"),
            "resumed_from_step": start,
            "data_parallel": "fsdp2" if self.shard else "none (zero 3, 1 process)" if self.fsdp else self.plain_parallel.lower(),
            "document_masking": self.masking,
        }
        if last_val is None:  # resumed at max_steps: still report validation (every rank: rows are shared)
            summary["final_val_loss"], _ = self.evaluate()
        state_dict = None
        if self.shard:  # the whole weights, gathered from every rank's shards (collective)
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            state_dict = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.env.main:
            return summary
        with atomic_path(out_dir) as tmp:
            self.model.save_pretrained(str(tmp), state_dict=state_dict)
            legacy_readable(tmp)  # 4.x readers of this folder get the same RoPE
            write_json(tmp / "train_summary.json", summary)
        log.info("trained model -> %s (final val_loss %.4f)", out_dir, summary["final_val_loss"])
        return summary


def train(cfg: dict, init_dir, data_dir, ckpt_root, metrics_path, out_dir, stop_after: int | None = None) -> dict | None:
    trainer = Trainer(cfg, Path(init_dir), Path(data_dir), Path(ckpt_root))
    start = trainer.resume()
    trainer.distribute()
    metrics = MetricsWriter(Path(metrics_path), start, trainer.env.main, tensorboard=True)
    try:
        flops = throughput_of(trainer.model.config.to_dict(), trainer.t["seq_len"], trainer.env.world, trainer.env.device)
        loop = StepLoop(trainer.t, trainer.sampler, start, metrics, trainer.env.main, flops)
        stopped, last_val = loop.run(trainer, stop_after)
    finally:
        if trainer.rows is not None:
            trainer.rows.close()
    summary = None if stopped else trainer.finish(Path(out_dir), start, last_val)
    metrics.close()
    if not stopped:
        trainer.env.barrier()
    trainer.env.close()
    return summary


def main(argv: list[str] | None = None) -> None:
    args = trainer_parser("llmpipe torch-train", __doc__).parse_args(argv)
    try:
        with trainer_lease(args.checkpoints, "llmpipe torch-train"):
            train(cfgmod.load(args.config), args.init, args.data, args.checkpoints, args.metrics, args.out, args.stop_after)
    except (NonFiniteError, CheckpointError, ValueError) as exc:  # ValueError: the setup's checks (view, batch)
        if isinstance(exc, ValueError) and os.environ.get("LLMPIPE_DEBUG"):
            raise
        raise SystemExit(f"llmpipe torch-train: {exc}") from None
