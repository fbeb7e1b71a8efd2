"""train-colossal: the shared training recipe on ColossalAI's Booster. Runs in the ColossalAI
environment (.venvs/colossal or envs/colossal.yaml: transformers 4.51.3), under torchrun, srun +
torchrun, or `colossalai run`; one plain process works too.

  python -m llmpipe train-colossal --config C --init DIR --data VIEW --tokenizer DIR \\
      --checkpoints DIR --metrics F --out DIR [--stop-after N]

Mapping of the shared keys: train.global_batch_size / (micro_batch_size x data-parallel size) =
gradient accumulation (pipeline: micro batches of micro_batch_size inside one schedule);
lr / min_lr / warmup_steps / max_steps = LambdaLR over llmpipe.train.schedule.lr_at; beta1, beta2,
eps, weight_decay (matrices only) = HybridAdam on GPU, torch AdamW on CPU; grad_clip = the
plugin's max_norm (ddp: clip_grad_norm_); precision auto = bf16 on GPU, fp32 on CPU (Gemini and
ZeRO need bf16). colossal.* picks the plugin and the parallel layout.

Checkpoints: <checkpoints>/step_XXXXXXXX/ with model/ (booster.save_model, sharded safetensors),
optimizer/, scheduler.pt, trainer_state.json and a `done` marker written last; the newest complete
one is resumed automatically. The final folder is HF format: sharded safetensors + index,
config.json, generation_config.json, the tokenizer and train_summary.json.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import socket
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from llmpipe import config as cfgmod
from llmpipe.backends.colossal.collate import collate
from llmpipe.backends.torch.checkpoint import CheckpointError, complete_steps, newest_intact, seal, step_dir
from llmpipe.io import write_json
from llmpipe.train.batching import Sampler, grad_accum_steps
from llmpipe.train.resume import RESUME_NEUTRAL
from llmpipe.train.guard import NonFiniteError, NonFiniteGuard
from llmpipe.train.schedule import lr_at
from llmpipe.io import dumps as io_dumps

log = logging.getLogger(__name__)
# bitsandbytes (imported by colossalai.nn through galore_torch) logs a warning about an optional CPU kernel.
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
# ColossalAI's checkpoint loaders call torch.load without weights_only (torch 2.5 defaults to False).
os.environ.setdefault("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "1")

IGNORE_INDEX = -100
# Keys that may change between a checkpoint and its resume.
GPU_ONLY = {"gemini", "gemini_auto", "zero2"}


# ---------------------------------------------------------------- setup

def init_distributed() -> None:
    """colossalai.launch_from_torch; a plain process (no torchrun) becomes a world of one."""
    import colossalai

    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
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
        raise ValueError(f"colossal.tp / pp / zero_stage apply to plugin 3d only (plugin is {c['plugin']})")
    if world % (c["tp"] * c["pp"]):
        raise ValueError(f"world size {world} is not a multiple of colossal.tp x colossal.pp = {c['tp'] * c['pp']}")
    if not on_gpu:
        if c["plugin"] in GPU_ONLY:
            raise ValueError(f"colossal.plugin {c['plugin']} needs CUDA GPUs (ColossalAI's chunk and ZeRO code asks "
                             "for a CUDA device); on CPU use ddp or 3d with tp=pp=1, zero_stage 0")
        if c["plugin"] == "3d" and (c["tp"] > 1 or c["zero_stage"]):
            raise ValueError("colossal.tp > 1 and zero_stage > 0 need CUDA GPUs; on CPU use tp=1, zero_stage 0")
        if c["pp"] > 1:  # without NCCL its p2p code calls torch.distributed.is_hccl_available (NPU builds only)
            raise ValueError("colossal.pp > 1 needs CUDA GPUs (ColossalAI 0.5.0's pipeline p2p fails on CPU torch builds)")


def make_plugin(c: dict, t: dict, precision: str, flash: bool, world: int):
    from colossalai.booster.plugin import GeminiPlugin, HybridParallelPlugin, LowLevelZeroPlugin, TorchDDPPlugin

    clip = t["grad_clip"]
    if c["plugin"] == "ddp":
        return TorchDDPPlugin()
    if c["plugin"] in ("gemini", "gemini_auto"):  # data parallel over the whole world
        accum = grad_accum_steps(t["global_batch_size"], t["micro_batch_size"], world) > 1
        return GeminiPlugin(precision=precision, placement_policy="static" if c["plugin"] == "gemini" else "auto",
                            max_norm=clip, initial_scale=1, enable_gradient_accumulation=accum,
                            enable_flash_attention=flash, verbose=False)
    if c["plugin"] == "zero2":
        return LowLevelZeroPlugin(stage=2, precision=precision, max_norm=clip, initial_scale=1)
    return HybridParallelPlugin(
        tp_size=c["tp"], pp_size=c["pp"], zero_stage=c["zero_stage"], precision=precision, max_norm=clip,
        microbatch_size=t["micro_batch_size"] if c["pp"] > 1 else None, initial_scale=1,
        enable_flash_attention=flash and c["tp"] > 1,
        parallel_output=False,  # whole-vocabulary logits on every tp rank: our loss reads them
        # ColossalAI 0.5.0 crashes (calls None) when asked for fused RMSNorm without apex
        enable_fused_normalization=torch.cuda.is_available() and importlib.util.find_spec("apex") is not None,
    )


def attention_impl(want_flash: bool, on_gpu: bool) -> str:
    if want_flash and on_gpu:
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except ImportError:
            log.info("flash-attn not installed: PyTorch SDPA attention (its flash kernel on bf16 GPUs)")
    return "sdpa"


def build_optimizer(model, t: dict, on_gpu: bool):
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": t["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    kw = dict(lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"])
    if on_gpu:
        from colossalai.nn.optimizer import HybridAdam

        opt = HybridAdam(groups, adamw_mode=True, **kw)
    else:  # HybridAdam's CPU kernel is a compiled extension; AdamW is the same update
        opt = torch.optim.AdamW(groups, **kw)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_at(s, t["lr"], t["min_lr"], t["warmup_steps"], t["max_steps"]) / t["lr"])
    return opt, sched


def fingerprint(cfg: dict, init_dir: Path, view_dir: Path) -> dict:
    """What a checkpoint must agree on to be resumed."""
    h = hashlib.sha256()
    for name in sorted(p.name for p in init_dir.glob("*.safetensors")) + ["config.json"]:
        h.update(name.encode())
        h.update(hashlib.sha256((init_dir / name).read_bytes()).digest())
    view = json.loads((view_dir / "view.json").read_text())
    layout = {k: cfg["colossal"][k] for k in ("plugin", "tp", "pp", "zero_stage")}
    if layout["plugin"] == "gemini_auto":  # same state as gemini: switching after an OOM resumes
        layout["plugin"] = "gemini"
    return {"train": {k: v for k, v in sorted(cfg["train"].items()) if k not in RESUME_NEUTRAL},
            "colossal": layout, "init_sha256": h.hexdigest(), "view": view["fingerprint"]}


# ---------------------------------------------------------------- checkpoints

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
            for old in complete_steps(root)[:-keep]:
                shutil.rmtree(step_dir(root, old), ignore_errors=True)
            log.info("checkpoint %s", target)

    def final(self, out: Path, model, hf_config, tokenizer_dir: Path | None, summary: dict) -> None:
        """HF folder: ColossalAI writes the weights; config.json and generation_config.json are
        written here (ColossalAI skips them under transformers 5.x), and the tokenizer is copied."""
        from transformers import GenerationConfig

        tmp = self._tmp(out)
        self.booster.save_model(model, str(tmp), shard=True, use_safetensors=True)
        dist.barrier()
        if self.rank == 0:
            hf_config.save_pretrained(str(tmp))
            GenerationConfig.from_model_config(hf_config).save_pretrained(str(tmp))
            if tokenizer_dir is not None:
                for f in tokenizer_dir.iterdir():
                    if f.is_file() and not f.name.startswith("."):
                        shutil.copy2(f, tmp / f.name)
            write_json(tmp / "train_summary.json", summary)
        self._publish(tmp, out)


# ---------------------------------------------------------------- the loop

def loss_sum(model, batch: dict) -> tuple[torch.Tensor, int]:
    """Sum of next-token cross-entropy over the labelled positions (the view's labels)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    labels = batch["labels"][:, 1:].reshape(-1)
    total = torch.nn.functional.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels, ignore_index=IGNORE_INDEX, reduction="sum")
    return total, int((labels != IGNORE_INDEX).sum())


class Layout:
    """Data-parallel rank and size (tp / pp ranks of one replica read the same rows)."""

    def __init__(self, plugin):
        group = getattr(plugin, "dp_group", None)
        self.dp_rank = dist.get_rank(group) if group is not None else dist.get_rank()
        self.dp_size = dist.get_world_size(group) if group is not None else dist.get_world_size()
        self.pipeline = bool(getattr(plugin, "pp_size", 1) > 1)
        stage = getattr(plugin, "stage_manager", None)
        self.last_stage = stage.is_last_stage() if self.pipeline else True
        # Ranks holding the same value: the tp ranks of a replica (of its last stage, with pp).
        self.amp = False
        self.copies = dist.get_world_size() // self.dp_size // (getattr(plugin, "pp_size", 1) if self.pipeline else 1)

    def autocast(self, device: torch.device):
        """bf16 autocast for the ddp plugin (the other plugins cast the model themselves)."""
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.amp)

    def sum_replicas(self, value: torch.Tensor) -> torch.Tensor:
        """Sum over the world of a per-rank value, each data-parallel replica counted once."""
        value = value.clone()
        dist.all_reduce(value)
        return value / self.copies


def train(cfg: dict, init_dir, data_dir, ckpt_root, metrics_path, out_dir, tokenizer_dir=None,
          stop_after: int | None = None) -> dict | None:
    import datasets
    from colossalai.booster import Booster
    from transformers import AutoModelForCausalLM

    t, c = cfg["train"], cfg["colossal"]
    init_dir, data_dir, ckpt_root, out_dir = map(Path, (init_dir, data_dir, ckpt_root, out_dir))
    tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir else None
    torch.set_num_threads(t["threads"])
    on_gpu = torch.cuda.is_available()
    check_layout(c, int(os.environ.get("WORLD_SIZE", "1")), on_gpu)
    precision = precision_of(t, c["plugin"], on_gpu)
    init_distributed()
    rank, main = dist.get_rank(), dist.get_rank() == 0
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")

    train_ds = datasets.load_from_disk(str(data_dir / "train"))
    val_ds = datasets.load_from_disk(str(data_dir / "val"))
    if len(train_ds[0]["input_ids"]) != t["seq_len"]:
        raise ValueError(f"view {data_dir} has rows of {len(train_ds[0]['input_ids'])} tokens, train.seq_len is {t['seq_len']}")
    sampler = Sampler(len(train_ds), t["seed"])

    attn = attention_impl(c["flash_attention"], on_gpu)
    plugin = make_plugin(c, t, precision, attn != "sdpa" or on_gpu and c["flash_attention"], dist.get_world_size())
    lay = Layout(plugin)
    lay.amp = c["plugin"] == "ddp" and precision == "bf16"
    accum = grad_accum_steps(t["global_batch_size"], t["micro_batch_size"], lay.dp_size)
    torch.manual_seed(t["seed"])
    model = AutoModelForCausalLM.from_pretrained(str(init_dir), torch_dtype=torch.float32, attn_implementation=attn,
                                                 trust_remote_code=False)
    hf_config = model.config
    if c["gradient_checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    optimizer, scheduler = build_optimizer(model, t, on_gpu)
    booster = Booster(plugin=plugin)
    model, optimizer, _, _, scheduler = booster.boost(model, optimizer, lr_scheduler=scheduler)
    saver = Saver(booster, rank, sharded=c["plugin"] != "ddp")
    fp = fingerprint(cfg, init_dir, data_dir)

    start = 0
    path = newest_intact(ckpt_root) if t["resume"] else None  # damaged steps are named and skipped
    if path is not None:
        state = json.loads((path / "trainer_state.json").read_text())
        if state["fingerprint"] != fp:
            changed = sorted(k for part in ("train", "colossal") for k in set(fp[part]) | set(state["fingerprint"].get(part, {}))
                             if fp[part].get(k) != state["fingerprint"].get(part, {}).get(k))
            raise CheckpointError(
                f"checkpoint {path} belongs to a different training setup (changed keys: {changed or 'none'}; init model "
                f"same: {state['fingerprint']['init_sha256'] == fp['init_sha256']}; data view same: "
                f"{state['fingerprint']['view'] == fp['view']}). Delete {ckpt_root} to start over, or set train.resume: false.")
        booster.load_model(model, str(path / "model"))
        booster.load_optimizer(optimizer, str(path / optimizer_name(saver.sharded)))
        booster.load_lr_scheduler(scheduler, str(path / "scheduler.pt"))
        start = state["step"]
        if main:
            log.info("resumed from %s (step %d)", path, start)

    metrics = Metrics(Path(metrics_path), start, main)
    if main:
        log.info("plugin %s (tp %d, pp %d, zero %d), world %d, dp %d, micro batch %d, grad accumulation %d, global "
                 "batch %d, precision %s, attention %s, gradient checkpointing %s, optimizer %s", c["plugin"], c["tp"],
                 c["pp"], c["zero_stage"], dist.get_world_size(), lay.dp_size, t["micro_batch_size"], accum,
                 t["global_batch_size"], precision, attn, c["gradient_checkpointing"], type(optimizer.optim).__name__
                 if hasattr(optimizer, "optim") else type(optimizer).__name__)

    def to_dev(b):
        return {k: v.to(device) for k, v in b.items()}

    def step_fn(batches: list[dict]) -> tuple[float, int]:
        """One optimizer step over this rank's micro batches; returns (global loss sum, global count)."""
        local = sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in batches)
        count = torch.tensor(float(local), device=device)
        dist.all_reduce(count, group=getattr(plugin, "dp_group", None))
        gcount = float(count)
        total = torch.zeros((), device=device, dtype=torch.float64)
        if lay.pipeline:
            merged = {k: torch.cat([b[k] for b in batches]) for k in batches[0]}
            scale = len(batches) * lay.dp_size / gcount  # the schedule divides by the micro batch count

            def criterion(outputs, inputs):
                part, _ = loss_sum(_Logits(outputs), inputs)
                return part * scale

            out = booster.execute_pipeline(iter([to_dev(merged)]), model, criterion, optimizer, return_loss=True)
            if lay.last_stage:
                total += out["loss"].detach().double() * gcount / lay.dp_size
        else:
            for i, b in enumerate(batches):
                ctx = booster.no_sync(model, optimizer) if (i < len(batches) - 1 and c["plugin"] == "ddp") else _null()
                with ctx, lay.autocast(device):
                    part, _ = loss_sum(model, to_dev(b))
                    # Plugins average gradients over data-parallel ranks: scale to the global token mean.
                    booster.backward(part * lay.dp_size / gcount, optimizer)
                total += part.detach().double()
        return total, gcount

    last_val = None
    guard = NonFiniteGuard(t["skip_nonfinite_steps"])
    tokens_per_step = t["global_batch_size"] * t["seq_len"]
    clock = time.perf_counter()
    for step in range(start, t["max_steps"]):
        micro = sampler.micro_batches(step, t["global_batch_size"], t["micro_batch_size"], lay.dp_rank, lay.dp_size)
        batches = [collate(train_ds[ids.tolist()]) for ids in micro]
        total, gcount = step_fn(batches)
        grad_norm = None
        if c["plugin"] == "ddp":
            max_norm = t["grad_clip"] if t["grad_clip"] > 0 else float("inf")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.unwrap().parameters(), max_norm))
        lr = scheduler.get_last_lr()[0]
        loss = float(lay.sum_replicas(total) / gcount)
        if guard.ok(step + 1, loss, grad_norm):  # ddp: the norm is known before the step
            optimizer.step()
            scheduler.step()
        optimizer.zero_grad()
        if grad_norm is None and hasattr(optimizer, "get_grad_norm"):
            value = optimizer.get_grad_norm()
            grad_norm = float(value) if value is not None else None
            guard.after_update(step + 1, grad_norm)  # sharded plugins: known after the step
        done = step + 1
        elapsed = time.perf_counter() - clock
        record = {"step": done, "loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens": done * tokens_per_step,
                  "epoch": sampler.epoch_of(done, t["global_batch_size"]),
                  "tokens_per_s": (done - start) * tokens_per_step / max(elapsed, 1e-9)}
        if done % t["eval_interval"] == 0 or done == t["max_steps"]:
            record["val_loss"], record["val_tokens"] = evaluate(model, val_ds, cfg["eval"]["batch_size"], lay, device,
                                                                booster)
            last_val = record["val_loss"]
        metrics.write(record)
        if main and (done % t["log_interval"] == 0 or done == t["max_steps"] or "val_loss" in record):
            log.info("step %d/%d loss %.4f lr %.2e grad_norm %s %.0f tok/s%s", done, t["max_steps"], loss, lr,
                     f"{grad_norm:.3f}" if grad_norm is not None else "-", record["tokens_per_s"],
                     f" val_loss {record['val_loss']:.4f}" if "val_loss" in record else "")
        if done % t["save_interval"] == 0 or done == t["max_steps"] or done == stop_after:
            saver.checkpoint(ckpt_root, done, model, optimizer, scheduler, {"fingerprint": fp}, t["keep_checkpoints"])
        if done == stop_after and done < t["max_steps"]:
            if main:
                log.info("stopping after step %d as asked (--stop-after); rerun to resume", done)
            dist.barrier()
            dist.destroy_process_group()
            return None

    if last_val is None:  # resumed at max_steps: still report validation
        last_val, _ = evaluate(model, val_ds, cfg["eval"]["batch_size"], lay, device, booster)
    summary = {"steps": t["max_steps"], "final_val_loss": last_val, "world_size": dist.get_world_size(),
               "precision": precision, "resumed_from_step": start, "plugin": c["plugin"], "tp": c["tp"], "pp": c["pp"],
               "zero_stage": c["zero_stage"], "attention": attn}
    saver.final(out_dir, model, hf_config, tokenizer_dir, summary)
    if main:
        log.info("trained model -> %s (final val_loss %.4f)", out_dir, last_val)
    dist.barrier()
    dist.destroy_process_group()
    return summary


@torch.no_grad()
def evaluate(model, dataset, batch_size: int, lay: Layout, device, booster) -> tuple[float, int]:
    """Token-weighted mean loss over the whole validation split, rows shared among data-parallel
    ranks (every rank runs the forward: Gemini / ZeRO / tp shard the weights)."""
    was = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = torch.zeros((), dtype=torch.float64, device=device)
    rows = list(range(lay.dp_rank, len(dataset), lay.dp_size))
    for start in range(0, len(rows), batch_size):
        b = {k: v.to(device) for k, v in collate(dataset[rows[start:start + batch_size]]).items()}
        if lay.pipeline:
            kept = {}

            def criterion(outputs, inputs):
                part, n = loss_sum(_Logits(outputs), inputs)
                kept["sum"], kept["n"] = kept.get("sum", 0) + part.double(), kept.get("n", 0) + n
                return part

            booster.execute_pipeline(iter([b]), model, criterion, None, return_loss=True)
            if lay.last_stage:
                total += kept["sum"]
                count += kept["n"]
        else:
            with lay.autocast(device):
                part, n = loss_sum(model, b)
            total += part.double()
            count += n
    model.train(was)
    total, count = lay.sum_replicas(total), lay.sum_replicas(count)
    if count == 0:
        raise ValueError("validation data has no labelled tokens")
    return float(total / count), int(count)


class _Logits:
    """Adapter so loss_sum can read pipeline outputs (a ModelOutput or a dict with logits)."""

    def __init__(self, outputs):
        self.outputs = outputs

    def __call__(self, **_):
        return self.outputs


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


class Metrics:
    """metrics.jsonl, written by rank 0 only (lines after the resumed step are dropped)."""

    def __init__(self, path: Path, resume_step: int, enabled: bool):
        self.path, self.enabled = path, enabled
        if not enabled:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if path.exists():
            kept = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= resume_step]
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, path)

    def write(self, record: dict) -> None:
        if self.enabled:
            with self.path.open("a") as fh:
                fh.write(io_dumps(record) + "\n")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe train-colossal", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--init", required=True, help="initial HF checkpoint folder")
    p.add_argument("--data", required=True, help="hf view folder (train/, val/, view.json)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder copied into --out")
    p.add_argument("--checkpoints", required=True, help="folder for resumable step_* checkpoints")
    p.add_argument("--metrics", required=True, help="metrics.jsonl path")
    p.add_argument("--out", required=True, help="final HF-format model folder")
    p.add_argument("--stop-after", type=int, default=None,
                   help="checkpoint after this step and exit without --out (as if preempted)")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*(apex|tensornvme|TensorNVMe).*")
    cfg = cfgmod.load(args.config)
    try:
        train(cfg, args.init, args.data, args.checkpoints, args.metrics, args.out, args.tokenizer, args.stop_after)
    except (NonFiniteError, CheckpointError) as exc:
        raise SystemExit(f"llmpipe train-colossal: {exc}") from None
    except torch.cuda.OutOfMemoryError as exc:
        fix = ("set colossal.plugin: gemini_auto (Gemini placing chunks in CPU memory too; it resumes this run's "
               "checkpoints)" if cfg["colossal"]["plugin"] == "gemini" else
               "turn on colossal.gradient_checkpointing, lower train.micro_batch_size, or use colossal.plugin gemini_auto")
        raise SystemExit(f"llmpipe train-colossal: out of GPU memory with colossal.plugin {cfg['colossal']['plugin']}: "
                         f"{fix}. ({str(exc).splitlines()[0]})") from None
