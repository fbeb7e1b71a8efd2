"""colossal-train: the shared training recipe on ColossalAI's Booster. Runs in the ColossalAI
environment (.venvs/colossal or envs/colossal.yaml: transformers 4.51.3), under torchrun, srun +
torchrun, or `colossalai run`; one plain process works too.

  python -m llmpipe colossal-train --config C --init DIR --data VIEW --tokenizer DIR \\
      --checkpoints DIR --metrics F --out DIR [--stop-after N]

Mapping of the shared keys: train.global_batch_size / (micro_batch_size x data-parallel size) =
gradient accumulation (pipeline: micro batches of micro_batch_size inside one schedule);
lr / min_lr / warmup_steps / max_steps = LambdaLR over llmpipe.train.schedule.lr_at; beta1, beta2,
eps, weight_decay (matrices only) = HybridAdam on GPU, torch AdamW on CPU; grad_clip = the
plugin's max_norm (ddp: clip_grad_norm_); precision auto = bf16 on GPU, fp32 on CPU (Gemini and
ZeRO need bf16). colossal.* picks the plugin and the parallel layout.

The recipe (loss, optimizer groups, schedule, resume fingerprint, metrics, step loop, checkpoint
steps) is llmpipe.train's, shared with the torch trainer; here: plugins, the Booster, the parallel layout.

Checkpoints: <checkpoints>/step_XXXXXXXX/ with model/ (booster.save_model, sharded safetensors),
optimizer/, scheduler.pt, trainer_state.json and a `done` marker written last; the newest complete
one is resumed automatically. The final folder is HF format: sharded safetensors + index,
config.json, generation_config.json, the tokenizer and train_summary.json.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import os
import socket
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from llmpipe import config as cfgmod
from llmpipe.backends.colossal.checkpoint import Saver, optimizer_name
from llmpipe.backends.colossal.checks import head_problems, layout_of, resume_layout
from llmpipe.backends.colossal.collate import collate
from llmpipe.backends.colossal.steps import Layout, PipelineLoss, counts_nothing, to_device
from llmpipe.model.folder import model_folder
from llmpipe.train.batching import Sampler, grad_accum_steps
from llmpipe.train.checkpoint import CheckpointError
from llmpipe.train.cli import trainer_parser
from llmpipe.train.guard import NonFiniteError, NonFiniteGuard
from llmpipe.train.lock import trainer_lease
from llmpipe.train.loop import StepLoop
from llmpipe.train.loss import label_count, lm_loss_sum, shared_rows
from llmpipe.train.metrics import MetricsWriter
from llmpipe.train.optim import build_optimizer
from llmpipe.train.resume import fingerprint, resume_state
from llmpipe.train.throughput import throughput_of
from llmpipe.train.view import load_view

log = logging.getLogger(__name__)
# bitsandbytes (imported by colossalai.nn through galore_torch) logs a warning about an optional CPU kernel.
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
# ColossalAI's checkpoint loaders call torch.load without weights_only (torch 2.5 defaults to False).
os.environ.setdefault("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "1")

GPU_ONLY = {"gemini", "gemini_auto", "zero2"}


# ---------------------------------------------------------------- setup


def init_distributed(timeout_minutes: int | None = None) -> None:
    """colossalai.launch_from_torch; a plain process (no torchrun) becomes a world of one. `timeout_minutes`
    (train.dist_timeout_minutes): the process group's timeout, which colossalai.launch does not take."""
    from datetime import timedelta
    from functools import partial
    from unittest import mock

    import colossalai

    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(
            RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        )
    init = partial(dist.init_process_group, timeout=timedelta(minutes=timeout_minutes)) if timeout_minutes else None
    with mock.patch.object(dist, "init_process_group", init) if init else contextlib.nullcontext():
        colossalai.launch_from_torch(backend="nccl" if torch.cuda.is_available() else "gloo", verbose=False)


def precision_of(t: dict, plugin: str, on_gpu: bool) -> str:
    p = t["precision"]
    if p == "auto":
        p = "bf16" if on_gpu and torch.cuda.is_bf16_supported() else "fp32"
    if plugin in GPU_ONLY and p == "fp32":
        raise ValueError(f"colossal.plugin {plugin} trains in bf16 only; set train.precision: bf16 (or auto on a GPU)")
    return p


def check_layout(c: dict, world: int, on_gpu: bool) -> None:
    """Refuse what cannot run, naming the key, before any model is built."""
    if c["plugin"] != "3d" and (c["tp"] > 1 or c["pp"] > 1 or c["zero_stage"]):
        raise ValueError(f"parallel.tp / pp / zero apply to colossal.plugin 3d only (plugin is {c['plugin']})")
    if world % (c["tp"] * c["pp"]):
        raise ValueError(f"world size {world} is not a multiple of parallel.tp x parallel.pp = {c['tp'] * c['pp']}")
    if not on_gpu:
        if c["plugin"] in GPU_ONLY:
            raise ValueError(
                f"colossal.plugin {c['plugin']} needs CUDA GPUs (ColossalAI's chunk and ZeRO code asks "
                "for a CUDA device); on CPU use ddp or 3d with parallel tp=pp=1, zero 0"
            )
        if c["plugin"] == "3d" and (c["tp"] > 1 or c["zero_stage"]):
            raise ValueError("parallel.tp > 1 and parallel.zero > 0 need CUDA GPUs; on CPU use tp=1, zero 0")
        if c["pp"] > 1:  # without NCCL its p2p code calls torch.distributed.is_hccl_available (NPU builds only)
            raise ValueError("parallel.pp > 1 needs CUDA GPUs (ColossalAI 0.5.0's pipeline p2p fails on CPU torch builds)")


def make_plugin(c: dict, t: dict, precision: str, flash: bool, world: int, offload: dict | None = None):
    """The Booster plugin of colossal section `c` (layout_of); `offload`: Gemini's static placement
    (offload_optim_frac, offload_param_frac; gemini_placement)."""
    from colossalai.booster.plugin import GeminiPlugin, HybridParallelPlugin, LowLevelZeroPlugin, TorchDDPPlugin

    clip = t["grad_clip"] or math.inf  # 0 (no clipping): inf still has ColossalAI compute the norm (metrics, guard)
    if c["plugin"] == "ddp":
        return TorchDDPPlugin()
    if c["plugin"] in ("gemini", "gemini_auto"):  # data parallel over the whole world
        accum = grad_accum_steps(t["global_batch_size"], t["micro_batch_size"], world) > 1
        static = {k: v for k, v in (offload or {}).items() if k in OFFLOAD} if c["plugin"] == "gemini" else {}
        return GeminiPlugin(
            precision=precision,
            placement_policy="static" if c["plugin"] == "gemini" else "auto",
            **static,
            max_norm=clip,
            initial_scale=1,
            enable_gradient_accumulation=accum,
            enable_flash_attention=flash,
            verbose=False,
        )
    if c["plugin"] == "zero2":
        return LowLevelZeroPlugin(stage=2, precision=precision, max_norm=clip, initial_scale=1)
    return HybridParallelPlugin(
        tp_size=c["tp"],
        pp_size=c["pp"],
        zero_stage=c["zero_stage"],
        precision=precision,
        max_norm=clip,
        microbatch_size=t["micro_batch_size"] if c["pp"] > 1 else None,
        initial_scale=1,
        enable_flash_attention=flash and c["tp"] > 1,
        parallel_output=False,  # whole-vocabulary logits on every tp rank: our loss reads them
        # ColossalAI 0.5.0 crashes (calls None) when asked for fused RMSNorm without apex
        enable_fused_normalization=torch.cuda.is_available() and importlib.util.find_spec("apex") is not None,
    )


OFFLOAD = ("offload_optim_frac", "offload_param_frac")


def gemini_placement(c: dict, t: dict, model_config: dict, world: int, device_bytes: int) -> dict:
    """Gemini's static placement: colossal.offload_* as set, null (auto) ones from the plan's memory estimate
    for this model, batch and GPU (placement.gemini_static); with "note", the log line."""
    from llmpipe.backends.colossal.placement import describe, gemini_static
    from llmpipe.plan.arithmetic import Shape

    set_ = {k: float(c[k]) for k in OFFLOAD if c.get(k) is not None}
    if len(set_) == len(OFFLOAD):  # both given: used as given, no estimate
        return {**set_, "note": f"set in colossal: {set_}"}
    accum = grad_accum_steps(t["global_batch_size"], t["micro_batch_size"], world)
    shape = Shape.from_hf(model_config)
    auto = gemini_static(shape, t["seq_len"], t["micro_batch_size"], accum, world, c["gradient_checkpointing"], device_bytes)
    chosen = {k: set_.get(k, auto[k]) for k in OFFLOAD}
    return {**chosen, "note": describe(auto) + (f"; set in colossal: {set_}" if set_ else "")}


def offload_threads(offload: dict | None, threads: int) -> int:
    """CPU threads of a training process: train.threads, or where Gemini keeps optimizer state in CPU
    memory, at least this process's share of the CPUs it may run on (HybridAdam's CPU kernel is OpenMP;
    its step over the offloaded state reads and writes 28 B a parameter, and one thread made the 7B's step
    on an H100 12.6 s: docs/benchmarks.md)."""
    if not offload or not (offload["offload_optim_frac"] or offload["offload_param_frac"]):
        return threads
    share = len(os.sched_getaffinity(0)) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(threads, share)


def use_threads(n: int) -> None:
    """n threads for torch and for an OpenMP kernel loaded later (HybridAdam's): a kernel sharing torch's
    libgomp follows set_num_threads, one with its own reads OMP_NUM_THREADS (torchrun sets it to 1)."""
    torch.set_num_threads(n)
    os.environ["OMP_NUM_THREADS"] = str(n)


def attention_impl(want_flash: bool, on_gpu: bool) -> str:
    if want_flash and on_gpu:
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except ImportError:
            log.info("flash-attn not installed: PyTorch SDPA attention (its flash kernel on bf16 GPUs)")
    return "sdpa"


def optimizer_kind(on_gpu: bool) -> tuple[type, dict]:
    """(optimizer class, its extra arguments) for llmpipe.train.optim.build_optimizer: HybridAdam in AdamW
    mode on GPU; on CPU torch AdamW (HybridAdam's CPU kernel is a compiled extension; same update)."""
    if on_gpu:
        from colossalai.nn.optimizer import HybridAdam

        return HybridAdam, {"adamw_mode": True}
    return torch.optim.AdamW, {}


# ---------------------------------------------------------------- the steps


def load_model(init_dir: Path, attn: str, gradient_checkpointing: bool):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_folder(init_dir, "--init"),
        torch_dtype=torch.float32,
        attn_implementation=attn,
        trust_remote_code=False,
        local_files_only=True,
    )
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


class Trainer:
    """One ColossalAI training run: setup here, steps driven by llmpipe.train.loop.StepLoop."""

    def __init__(self, cfg: dict, init_dir: Path, data_dir: Path, ckpt_root: Path, tokenizer_dir: Path | None):
        self.cfg, self.t, self.c = cfg, cfg["train"], layout_of(cfg)
        self.ckpt_root, self.tokenizer_dir = ckpt_root, tokenizer_dir
        torch.set_num_threads(self.t["threads"])
        self.on_gpu = torch.cuda.is_available()
        conf = json.loads((Path(model_folder(init_dir, "--init")) / "config.json").read_text())
        if problems := head_problems(self.c["tp"], conf, f"{init_dir}/config.json: "):
            raise ValueError("; ".join(problems))
        check_layout(self.c, int(os.environ.get("WORLD_SIZE", "1")), self.on_gpu)
        self.precision = precision_of(self.t, self.c["plugin"], self.on_gpu)
        init_distributed(self.t.get("dist_timeout_minutes"))
        self.main = dist.get_rank() == 0
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.on_gpu else torch.device("cpu")
        self.train_ds, self.val_ds = load_view(data_dir, self.t)
        self.sampler = Sampler(len(self.train_ds), self.t["seed"])
        self.boost(init_dir)
        self.fp = fingerprint(cfg, init_dir, data_dir, colossal=resume_layout(self.c))
        self.guard = NonFiniteGuard(self.t["skip_nonfinite_steps"])

    def boost(self, init_dir: Path) -> None:
        """The plugin, and the model, optimizer and schedule boosted by it."""
        from colossalai.booster import Booster

        t, c = self.t, self.c
        self.attn = attention_impl(c["flash_attention"], self.on_gpu)
        flash = self.attn != "sdpa" or self.on_gpu and c["flash_attention"]
        self.offload = None
        if c["plugin"] == "gemini":  # on GPU only (check_layout)
            conf = json.loads((init_dir / "config.json").read_text())
            props = torch.cuda.get_device_properties(self.device)
            self.offload = gemini_placement(c, t, conf, dist.get_world_size(), props.total_memory)
            use_threads(offload_threads(self.offload, t["threads"]))
        self.plugin = make_plugin(c, t, self.precision, flash, dist.get_world_size(), self.offload)
        self.lay = Layout(self.plugin, amp=c["plugin"] == "ddp" and self.precision == "bf16")
        self.accum = grad_accum_steps(t["global_batch_size"], t["micro_batch_size"], self.lay.dp_size)
        torch.manual_seed(t["seed"])
        model = load_model(init_dir, self.attn, c["gradient_checkpointing"])
        self.hf_config, self.generation = model.config, getattr(model, "generation_config", None)  # the init's own
        optimizer_cls, kwargs = optimizer_kind(self.on_gpu)
        optimizer, scheduler = build_optimizer(model, t, optimizer_cls, **kwargs)
        self.booster = Booster(plugin=self.plugin)
        self.model, self.optimizer, _, _, self.scheduler = self.booster.boost(model, optimizer, lr_scheduler=scheduler)
        self.saver = Saver(self.booster, dist.get_rank(), sharded=c["plugin"] != "ddp")

    def resume(self) -> int:
        """Restore the newest intact checkpoint of this setup and layout; its step."""
        found = resume_state(self.ckpt_root, self.t, self.fp, self.main, dist.barrier)
        if found is None:
            return 0
        path, state = found
        self.guard.restore(state)
        self.booster.load_model(self.model, str(path / "model"))
        self.booster.load_optimizer(self.optimizer, str(path / optimizer_name(self.saver.sharded)))
        self.booster.load_lr_scheduler(self.scheduler, str(path / "scheduler.pt"))
        if self.main:
            log.info("resumed from %s (step %d)", path, state["step"])
        return state["step"]

    def log_setup(self) -> None:
        if not self.main:
            return
        t, c = self.t, self.c
        opt = getattr(self.optimizer, "optim", self.optimizer)
        log.info(
            "plugin %s (tp %d, pp %d, zero %d), world %d, dp %d, micro batch %d, grad accumulation %d, global "
            "batch %d, precision %s, attention %s, gradient checkpointing %s, optimizer %s",
            c["plugin"],
            c["tp"],
            c["pp"],
            c["zero_stage"],
            dist.get_world_size(),
            self.lay.dp_size,
            t["micro_batch_size"],
            self.accum,
            t["global_batch_size"],
            self.precision,
            self.attn,
            c["gradient_checkpointing"],
            type(opt).__name__,
        )
        if self.offload:
            log.info("Gemini static placement: %s; %d CPU threads", self.offload["note"], torch.get_num_threads())

    def train_step(self, step: int) -> tuple[float, float, float | None]:
        t, lay = self.t, self.lay
        micro = self.sampler.micro_batches(step, t["global_batch_size"], t["micro_batch_size"], lay.dp_rank, lay.dp_size)
        total, gcount = self.forward_backward([collate(self.train_ds[ids.tolist()]) for ids in micro])
        grad_norm = self.clip_grad_norm()
        lr = self.scheduler.get_last_lr()[0]
        loss = float(lay.sum_replicas(total) / gcount)
        if self.guard.ok(step + 1, loss, grad_norm):  # ddp: the norm is known before the step
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad()
        if grad_norm is None:
            grad_norm = self.sharded_grad_norm(step)
        return loss, lr, grad_norm

    def forward_backward(self, batches: list[dict]) -> tuple[torch.Tensor, float]:
        """Gradients of the global token-mean loss from this rank's micro batches (with pp: all of them in one
        pipeline schedule); (this rank's loss sum, the global labelled count)."""
        count = torch.tensor(float(label_count(batches)), device=self.device)
        dist.all_reduce(count, group=getattr(self.plugin, "dp_group", None))
        gcount = float(count)
        groups = [{k: torch.cat([b[k] for b in batches]) for k in batches[0]}] if self.lay.pipeline else batches
        total = torch.zeros((), device=self.device, dtype=torch.float64)
        for i, group in enumerate(groups):
            with self.no_sync(last=i == len(groups) - 1):
                part, _ = self.forward(to_device(group, self.device), gcount, micro=len(batches))
            total += part
        return total, gcount

    def forward(self, batch: dict, gcount: float | None = None, micro: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss sum, labelled count) of `batch` on this rank, zeros off the pipeline's last stage. Given the
        global count `gcount`, also back-propagates this rank's share of the global token-mean loss (with pp
        the batch is `micro` micro batches of one schedule, which divides the loss by their number)."""
        optimizer = self.optimizer if gcount is not None else None
        if self.lay.pipeline:
            crit = PipelineLoss(self.device, micro * self.lay.dp_size / gcount if gcount is not None else 1.0)
            if optimizer is not None:  # a validation batch (forward only) left its sizes in the 1F1B schedule
                self.plugin.scheduler.num_microbatches = self.plugin.scheduler.last_batch_size = None
            sync = self.model.require_grad_sync
            if optimizer is None:  # forward only: no gradients to reduce (tied weights' grads are None)
                self.model.require_grad_sync = False
            try:
                self.booster.execute_pipeline(iter([batch]), self.model, crit, optimizer, return_loss=True)
            finally:
                self.model.require_grad_sync = sync
            return crit.total, crit.count
        with self.lay.autocast(self.device):
            part, n = lm_loss_sum(self.model, batch["input_ids"], batch["labels"], batch["attention_mask"])
            if optimizer is not None:
                # Plugins average gradients over data-parallel ranks: scale to the global token mean.
                self.booster.backward(part * self.lay.dp_size / gcount, optimizer)
        return part.detach().double(), n

    def no_sync(self, last: bool):
        """ddp: no gradient all-reduce but after the last micro batch of a step (the others reduce in the step)."""
        if last or self.c["plugin"] != "ddp":
            return contextlib.nullcontext()
        return self.booster.no_sync(self.model, self.optimizer)

    def clip_grad_norm(self) -> float | None:
        """ddp: clip here, before the step, and return the norm; the other plugins clip inside their step."""
        if self.c["plugin"] != "ddp":
            return None
        max_norm = self.t["grad_clip"] if self.t["grad_clip"] > 0 else float("inf")
        return float(torch.nn.utils.clip_grad_norm_(self.model.unwrap().parameters(), max_norm))

    def sharded_grad_norm(self, step: int) -> float | None:
        """The norm a sharded optimizer found in its step: known only after the update, checked then."""
        if not hasattr(self.optimizer, "get_grad_norm"):
            return None
        value = self.optimizer.get_grad_norm()
        grad_norm = float(value) if value is not None else None
        self.guard.after_update(step + 1, grad_norm)
        return grad_norm

    @torch.no_grad()
    def validate(self) -> tuple[float, int]:
        """Token-weighted mean loss over the validation split (eval.max_batches), rows shared among data-parallel
        ranks (every rank runs the forward: Gemini / ZeRO / tp shard the weights)."""
        was = self.model.training
        self.model.eval()
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        count = torch.zeros((), dtype=torch.float64, device=self.device)
        e = self.cfg["eval"]
        for ids in shared_rows(len(self.val_ds), e["batch_size"], self.lay.dp_rank, self.lay.dp_size, e.get("max_batches")):
            batch = collate(self.val_ds[list(ids) or [0]])
            if not ids:  # this rank's rows ran out: a row that counts for nothing
                batch = counts_nothing(batch)
            part, n = self.forward(to_device(batch, self.device))
            total += part
            count += n
        self.model.train(was)
        total, count = self.lay.sum_replicas(total), self.lay.sum_replicas(count)
        if count == 0:
            raise ValueError("validation data has no labelled tokens")
        return float(total / count), int(count)

    def save(self, step: int) -> None:
        self.saver.checkpoint(
            self.ckpt_root,
            step,
            self.model,
            self.optimizer,
            self.scheduler,
            {"fingerprint": self.fp, **self.guard.state()},
            self.t["keep_checkpoints"],
        )

    def finish(self, out_dir: Path, start: int, last_val: float | None) -> dict:
        """The final HF folder with train_summary.json; the summary."""
        if last_val is None:  # resumed at max_steps: still report validation
            last_val, _ = self.validate()
        c = self.c
        summary = {
            "steps": self.t["max_steps"],
            "final_val_loss": last_val,
            "world_size": dist.get_world_size(),
            "precision": self.precision,
            "resumed_from_step": start,
            "plugin": c["plugin"],
            "tp": c["tp"],
            "pp": c["pp"],
            "zero_stage": c["zero_stage"],
            "attention": self.attn,
        }
        self.saver.final(out_dir, self.model, self.hf_config, self.tokenizer_dir, summary, self.generation)
        if self.main:
            log.info("trained model -> %s (final val_loss %.4f)", out_dir, last_val)
        return summary


def train(
    cfg: dict, init_dir, data_dir, ckpt_root, metrics_path, out_dir, tokenizer_dir=None, stop_after: int | None = None
) -> dict | None:
    trainer = Trainer(cfg, Path(init_dir), Path(data_dir), Path(ckpt_root), Path(tokenizer_dir) if tokenizer_dir else None)
    start = trainer.resume()
    metrics = MetricsWriter(Path(metrics_path), start, trainer.main)
    trainer.log_setup()
    flops = throughput_of(trainer.hf_config.to_dict(), trainer.t["seq_len"], dist.get_world_size(), trainer.device)
    stopped, last_val = StepLoop(trainer.t, trainer.sampler, start, metrics, trainer.main, flops).run(trainer, stop_after)
    summary = None if stopped else trainer.finish(Path(out_dir), start, last_val)
    dist.barrier()
    dist.destroy_process_group()
    return summary


def main(argv: list[str] | None = None) -> None:
    args = trainer_parser("llmpipe colossal-train", __doc__, tokenizer=True).parse_args(argv)
    warnings.filterwarnings("ignore", message=".*(apex|tensornvme|TensorNVMe).*")
    with trainer_lease(args.checkpoints, "llmpipe colossal-train"):
        train_or_exit(cfgmod.load(args.config), args)


def train_or_exit(cfg: dict, args) -> None:
    """train(), its expected failures as one line."""
    try:
        train(cfg, args.init, args.data, args.checkpoints, args.metrics, args.out, args.tokenizer, args.stop_after)
    except (NonFiniteError, CheckpointError, ValueError) as exc:  # ValueError: the setup's checks (layout, batch, view)
        if isinstance(exc, ValueError) and os.environ.get("LLMPIPE_DEBUG"):
            raise
        raise SystemExit(f"llmpipe colossal-train: {exc}") from None
    except torch.cuda.OutOfMemoryError as exc:
        fix = (
            "set colossal.plugin: gemini_auto (Gemini placing chunks in CPU memory too; it resumes this run's checkpoints)"
            if cfg["colossal"]["plugin"] == "gemini"
            else "turn on parallel.activation_checkpointing, lower train.micro_batch_size, or use colossal.plugin gemini_auto"
        )
        raise SystemExit(
            f"llmpipe colossal-train: out of GPU memory with colossal.plugin {cfg['colossal']['plugin']}: "
            f"{fix}. ({str(exc).splitlines()[0]})"
        ) from None
