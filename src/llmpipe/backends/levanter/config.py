"""levanter-config: the shared llmpipe config -> Levanter's TrainLmConfig YAML (levanter.main.train_lm).

The mapping (the one place it lives; README "TPU path with Levanter" repeats it):

  train.global_batch_size      trainer.train_batch_size (sequences per step, all devices)
  train.micro_batch_size       trainer.per_device_parallelism (accumulation = global / (micro x devices))
  eval.batch_size              trainer.per_device_eval_parallelism
  train.max_steps              trainer.num_train_steps
  train.lr, min_lr             optimizer.learning_rate, optimizer.min_lr_ratio = min_lr / lr
  train.warmup_steps           optimizer.warmup (steps; 1 is written as a fraction of the run that Levanter
                               rounds to 1 step: it reads 1 as the whole run), optimizer.lr_schedule: cosine
  train.beta1, beta2, eps      optimizer.beta1, beta2, epsilon
  train.weight_decay           optimizer.weight_decay on every Linear and Embedding weight, nothing else
                               (optimizer.weight_decay_modules; ours: every matrix. Levanter's default mask
                               would leave the embeddings out)
  train.grad_clip              optimizer.max_grad_norm (0 -> null: no clipping)
  train.eval_interval          trainer.steps_per_eval (the last step is always evaluated)
  train.save_interval          trainer.checkpointer.keep: [{every: save_interval}] (+ a time-based one every
                               levanter.save_minutes; the last step is always saved)
  train.seed                   trainer.seed (model init)
  train.resume                 false: trainer.load_checkpoint false; levanter-train then restarts the run once
                               (removes the run id's old checkpoints and exports; its retries resume the restart)
  train.precision / levanter.mp  trainer.mp: fp32 -> f32, bf16 -> p=f32,c=bfloat16, auto -> bf16 compute when
                               libtpu is installed (a TPU environment) or JAX_PLATFORMS names tpu/cuda, else f32
  train.seq_len                model.max_seq_len and train_seq_len
  model.*                      model (type llama): hidden_dim, intermediate_dim, num_layers, num_heads,
                               num_kv_heads, layer_norm_epsilon, rope.theta, tie_word_embeddings,
                               initializer_range
  model.init_from              initialize_from_hf: the reference folder (links to init_model's local copy of the
                               base model) + use_hf_model_config: true (continued pre-training)
  data.shuffle, shuffle_seed   data.shuffle, data_seed (Levanter's own seeded permutation of the packed sequences)
  tokenizer, init checkpoint   data.tokenizer, model.tokenizer, model.reference_checkpoint: the local reference
                               folder (reference_folder: tokenizer + config.json + init weights; no hub access)
  levanter.run_id (or run)     trainer.id: fixed, so a rerun resumes from <output>/checkpoints/<id>/step-N
  levanter.extra               merged last, key by key: any other Levanter setting

Data: one cached component read from the levanter cache (no sources: Levanter never tokenizes), causal
attention over the whole packed row (data.block_cross_document_attention: false), as the torch backend
trains and our evaluate rule scores with train.document_masking false (not their default, auto). Metrics: json_logger tracker (parsed by `llmpipe levanter-train`).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import logging
import os
from pathlib import Path

import yaml

from llmpipe import config as cfgmod
from llmpipe.io import atomic_path
from llmpipe.model.hf_compat import add_legacy_tokenizer_class, with_legacy_keys

log = logging.getLogger(__name__)


def mixed_precision(cfg: dict) -> str:
    if cfg["levanter"]["mp"]:
        return cfg["levanter"]["mp"]
    precision = cfg["train"]["precision"]
    if precision == "auto":
        platforms = (cfg["levanter"]["jax_platforms"] or os.environ.get("JAX_PLATFORMS", "")).lower()
        accel = any(p in platforms for p in ("tpu", "cuda", "gpu")) or (
            not platforms and importlib.util.find_spec("libtpu") is not None
        )
        precision = "bf16" if accel else "fp32"
    return "p=f32,c=bfloat16" if precision == "bf16" else "f32"


# Weights that get weight decay, matched against Levanter's class key paths (Linear.weight, Embedding.weight):
# every matrix, as our trainers decay them; norms and biases none.
DECAYED = r"^(Linear|Embedding)\.weight$"


def warmup(steps: int, max_steps: int) -> int | float:
    """train.warmup_steps as Levanter's optimizer.warmup, which reads a value <= 1 as a fraction of the run:
    1 step becomes 1.5 / max_steps (int(1.5 / n * n) == 1)."""
    return 1.5 / max_steps if steps == 1 and max_steps > 1 else int(steps)


def merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def reference_folder(init: str | Path, tokenizer: str | Path, out: Path) -> None:
    """A local reference checkpoint Levanter's transformers (4.x) reads: the init config.json (+ rope_theta,
    rope_scaling: the 4.x names), the tokenizer with a tokenizer class 4.x knows, and links to the init weights."""
    init, tokenizer = Path(init).resolve(), Path(tokenizer).resolve()
    out.mkdir(parents=True)
    conf = with_legacy_keys(json.loads((init / "config.json").read_text()))
    (out / "config.json").write_text(json.dumps(conf, indent=2))
    for f in tokenizer.iterdir():
        if f.is_file():
            (out / f.name).write_bytes(f.read_bytes())
    add_legacy_tokenizer_class(out)
    for w in sorted(init.glob("*.safetensors")) + sorted(init.glob("*.safetensors.index.json")):
        (out / w.name).symlink_to(w)


def levanter_config(cfg: dict, cache: str | Path, reference: str | Path, output: str | Path) -> dict:
    """The TrainLmConfig as a dict. `reference`: the folder reference_folder wrote (tokenizer, config.json,
    init weights). Paths are made absolute (Levanter may change directory)."""
    t, m, lev = cfg["train"], cfg["model"], cfg["levanter"]
    cache, tokenizer = (str(Path(p).resolve()) for p in (cache, reference))
    init = tokenizer
    output = str(output) if "://" in str(output) else str(Path(output).resolve())
    if t["global_batch_size"] % t["micro_batch_size"]:
        raise ValueError(
            f"train.global_batch_size {t['global_batch_size']} must divide by train.micro_batch_size {t['micro_batch_size']}"
        )
    run_id = lev["run_id"] or cfg["run"]
    out = {
        "data": {
            "tokenizer": tokenizer,
            "cache_dir": cache,
            "auto_build_caches": False,
            "shuffle": bool(cfg["data"]["shuffle"]),
            "block_cross_document_attention": False,
            "components": {"llmpipe": {"cache_dir": cache}},
            "train_weights": {"llmpipe": 1.0},
        },
        "model": {
            "type": "llama",
            "max_seq_len": t["seq_len"],
            "hidden_dim": m["hidden_size"],
            "intermediate_dim": m["intermediate_size"],
            "num_layers": m["num_hidden_layers"],
            "num_heads": m["num_attention_heads"],
            "num_kv_heads": m["num_key_value_heads"],
            "layer_norm_epsilon": m["rms_norm_eps"],
            "initializer_range": m["initializer_range"],
            "tie_word_embeddings": m["tie_word_embeddings"],
            "rope": {"type": "default", "theta": m["rope_theta"]},
            "gradient_checkpointing": cfg["parallel"]["activation_checkpointing"],
            "tokenizer": tokenizer,
            "reference_checkpoint": init,
        },
        "train_seq_len": t["seq_len"],
        "trainer": {
            "id": run_id,
            "seed": t["seed"],
            "mp": mixed_precision(cfg),
            "tracker": {"type": "json_logger"},
            "require_accelerator": False,
            "log_dir": f"{output}/logs",
            "train_batch_size": t["global_batch_size"],
            "per_device_parallelism": t["micro_batch_size"],
            "per_device_eval_parallelism": cfg["eval"]["batch_size"],
            "num_train_steps": t["max_steps"],
            "steps_per_eval": t["eval_interval"],
            "checkpointer": {
                "base_path": f"{output}/checkpoints",
                "save_interval": f"{lev['save_minutes']}m",
                "keep": [{"every": t["save_interval"]}],
            },
            "mesh": {"axes": {"data": -1, "replica": 1, "model": 1}},
        },
        "optimizer": {
            "type": "adam",
            "learning_rate": t["lr"],
            "min_lr_ratio": t["min_lr"] / t["lr"],
            "warmup": warmup(t["warmup_steps"], t["max_steps"]),
            "lr_schedule": "cosine",
            "beta1": t["beta1"],
            "beta2": t["beta2"],
            "epsilon": t["eps"],
            "weight_decay": t["weight_decay"],
            "weight_decay_modules": DECAYED,
            "default_weight_decay_mask": False,
            "max_grad_norm": t["grad_clip"] or None,
        },
        "data_seed": cfg["data"]["shuffle_seed"],
        "hf_save_path": f"{output}/hf",
        "hf_save_steps": t["max_steps"],
    }
    if not t["resume"]:
        out["trainer"]["load_checkpoint"] = False
    if m["init_from"]:
        out["initialize_from_hf"] = init
        out["use_hf_model_config"] = True
    return merge(out, lev["extra"])


def write(cfg: dict, cache, tokenizer, init, output, out) -> Path:
    """Write `out`/config.yaml and `out`/reference/ (atomically, as one folder); the config.yaml path."""
    out = Path(out)
    lev = levanter_config(cfg, cache, out / "reference", output)
    with atomic_path(out) as tmp:
        reference_folder(init, tokenizer, tmp / "reference")
        (tmp / "config.yaml").write_text(
            f"# written by llmpipe levanter-config from the llmpipe config; run: {cfg['run']}\n"
            + yaml.safe_dump(lev, sort_keys=False)
        )
    log.info("levanter config %s: %s", out / "config.yaml", json.dumps(lev["trainer"]))
    return out / "config.yaml"


def add_arguments(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--config", required=required, help="llmpipe config (YAML/JSON file or JSON text)")
    p.add_argument("--cache", required=required, help="levanter cache folder (llmpipe levanter-cache)")
    p.add_argument("--tokenizer", required=required, help="local HF tokenizer folder")
    p.add_argument("--init", required=required, help="init checkpoint folder (config.json; the base model if model.init_from)")
    p.add_argument("--output", required=required, help="Levanter's checkpoints, HF exports and logs go here")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="llmpipe levanter-config", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(p)
    p.add_argument("--out", required=True, help="folder to write: config.yaml + reference/")
    args = p.parse_args(argv)
    write(cfgmod.load(args.config), args.cache, args.tokenizer, args.init, args.output, args.out)
