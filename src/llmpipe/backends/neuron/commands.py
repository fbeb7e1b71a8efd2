"""neuron-train / neuron-precompile: run NxD's Llama trainers under Slurm, or extract and compile their
graphs first with neuron_parallel_compile.

  python -m llmpipe neuron-precompile --config CFG --init INIT --data VIEW --checkpoint-dir CKPT --out MARKER
  python -m llmpipe neuron-train      --config CFG --init INIT --data VIEW --checkpoint-dir CKPT --out SUMMARY
  (--dry-run prints the environment and the command instead of running it)

Two trainers from NxD's examples (neuron.script; auto = tp_zero1 at parallel.pp 1, else tp_pp):
  tp_pp     examples/training/llama/tp_pp_llama_hf_pretrain/run_llama_nxd.py (pp >= 2: at pp 1 it builds
            the model with return_dict=False and NxD's run_train calls backward() on a tuple)
  tp_zero1  examples/training/llama/tp_zero1_llama_hf_pretrain/tp_zero1_llama_hf_pretrain.py (tp + ZeRO-1,
            no pipeline; NxD's Llama-2-7B recipe)

The launch is llmpipe.launch's: one task per node through `srun`, each running torchrun with
--nnodes / --node_rank / --master_addr from the Slurm job (port neuron.master_port, 44000 as the
recipes); precompile wraps each node's command in `neuron_parallel_compile`, with the same nodes,
flags and compile cache, the steps cut to neuron.extract_steps and no checkpoint saving.

Mapping of the shared schema (train:) to the trainers' flags (DP = parallel.nproc_per_node x
parallel.nnodes / (tp x pp); per-replica batch = global_batch_size / DP):
  tp_pp:    --train_batch_size per-replica batch, --num_microbatches = it / micro_batch_size;
            lr, min_lr, warmup_steps, max_steps, beta1, beta2, seed -> same names (cosine to min_lr).
  tp_zero1: --batch_size micro_batch_size, --grad_accum_usteps = per-replica batch / micro_batch_size;
            lr, warmup_steps, max_steps, weight_decay, beta1, beta2, seed -> same names (linear warmup,
            then linear decay to 0 at max_steps: train.min_lr must be 0).
  both:     seq_len -> --seq_len; save_interval -> --checkpoint_freq; keep_checkpoints ->
            --num_kept_checkpoint; log_interval -> --logging_interval; resume -> --loading_step
            latest_if_exists (else -1).
What the trainers hard-code is refused when set otherwise, naming the key: gradient clipping at 1.0
(train.grad_clip); AdamW's eps (train.eps: 1e-6 for NxD's AdamW_FP32OptimParams and transformers'
AdamW, 1e-8 for torch's AdamW under tp_pp without neuron.fp32_optimizer); weight decay 0.01 per
parameter group in run_llama_nxd.py's training_utils (train.weight_decay, tp_pp only: tp_zero1 passes
it on); xser checkpoints (neuron.save_xser, tp_zero1). Both save every --checkpoint_freq steps and not
at the end, so max_steps must be a multiple of save_interval.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path

from llmpipe import config as cfgmod
from llmpipe import launch
from llmpipe.backends.neuron import resume_view
from llmpipe.backends.neuron.layout import Dims, Layout, LayoutError, data_parallel
from llmpipe.backends.neuron.resume import complete_steps, prepare
from llmpipe.io import write_json
from llmpipe.train.checkpoint import CheckpointError

log = logging.getLogger(__name__)

SCRIPTS = {
    "tp_pp": "examples/training/llama/tp_pp_llama_hf_pretrain/run_llama_nxd.py",
    "tp_zero1": "examples/training/llama/tp_zero1_llama_hf_pretrain/tp_zero1_llama_hf_pretrain.py",
}
COMPILE_WRAPPER = "neuron_parallel_compile"


class NeuronConfigError(ValueError):
    """The config cannot be mapped onto NxD's trainer (raised before any job runs)."""


def script_kind(cfg: dict) -> str:
    n = cfg["neuron"]
    return n["script"] if n["script"] != "auto" else ("tp_zero1" if cfg["parallel"]["pp"] == 1 else "tp_pp")


def layout_of(cfg: dict) -> Layout:
    """The rank-file layout: parallel.tp / pp and the neuron section's QKV and hardware keys."""
    return Layout.from_config(cfg)


def script_path(cfg: dict) -> Path:
    return Path(cfg["neuron"]["nxd_dir"]) / SCRIPTS[script_kind(cfg)]


def adam_eps(cfg: dict) -> float:
    """The eps of the optimizer class the trainer builds (it passes none)."""
    fp32_params = cfg["neuron"]["fp32_optimizer"] or script_kind(cfg) == "tp_zero1"  # transformers' AdamW: 1e-6 too
    return 1e-6 if fp32_params else 1e-8


def batch_plan(cfg: dict) -> dict:
    """Data parallelism and the trainer's batch flags from train.* and neuron.*; every setting the
    trainer would not honour is refused here, naming the key."""
    t, n, p = cfg["train"], cfg["neuron"], cfg["parallel"]
    kind, name = script_kind(cfg), Path(SCRIPTS[script_kind(cfg)]).name
    world = p["nproc_per_node"] * p["nnodes"]
    errs = []
    if world % (p["tp"] * p["pp"]):
        raise NeuronConfigError(
            f"parallel.tp {p['tp']} x parallel.pp {p['pp']} must divide the {world} NeuronCores "
            f"(parallel.nproc_per_node {p['nproc_per_node']} x parallel.nnodes {p['nnodes']})"
        )
    dp = data_parallel(p)
    gbs, micro = t["global_batch_size"], t["micro_batch_size"]
    if gbs % dp:
        raise NeuronConfigError(
            f"train.global_batch_size {gbs} must be a multiple of data parallelism {dp} "
            f"(= {world} cores / tp {p['tp']} / pp {p['pp']})"
        )
    per_dp = gbs // dp
    if per_dp % micro:
        errs.append(f"train.micro_batch_size {micro} must divide the per-replica batch {per_dp} (global {gbs} / DP {dp})")
    if kind == "tp_pp" and p["pp"] == 1:
        errs.append(
            "neuron.script tp_pp (run_llama_nxd.py) cannot train at parallel.pp 1: it builds the model with "
            "return_dict=False and NxD's run_train then calls backward() on a tuple; use neuron.script "
            "tp_zero1 (NxD's tp + ZeRO-1 recipe; auto picks it at pp 1) or parallel.pp >= 2"
        )
    if p["zero"] not in (0, 1):
        errs.append(f"{name} has ZeRO-1 or none: parallel.zero {p['zero']} cannot be honoured (set 0 or 1)")
    # both scripts: selective, else "full" (run_llama_nxd.py: activation_checkpoint_config=... if
    # use_selective_checkpoint > 0 else "full"; NxD's trainer then checkpoints every decoder layer)
    if p["activation_checkpointing"] is False:
        errs.append(
            f"{name} checkpoints selectively or every layer: parallel.activation_checkpointing False cannot be "
            "honoured (set selective or true)"
        )
    if kind == "tp_zero1":
        if p["pp"] != 1 or n["vpp"] != 1:
            errs.append(f"neuron.script tp_zero1 has no pipeline: parallel.pp ({p['pp']}) and neuron.vpp ({n['vpp']}) must be 1")
        if t["min_lr"] != 0:
            errs.append(
                f"{name} decays the learning rate linearly to 0 at max_steps: train.min_lr {t['min_lr']} "
                "cannot be honoured (set 0)"
            )
        if not n["save_xser"]:
            errs.append(f"{name} always saves xser checkpoints: neuron.save_xser false cannot be honoured")
    elif t["weight_decay"] != 0.01:
        errs.append(
            f"{name} sets weight decay 0.01 per parameter group (training_utils, hard-coded): "
            f"train.weight_decay {t['weight_decay']} cannot be honoured (set 0.01, or use neuron.script tp_zero1)"
        )
    if t["grad_clip"] != 1.0:
        errs.append(f"{name} clips gradients at 1.0 (hard-coded): train.grad_clip {t['grad_clip']} cannot be honoured")
    if t["eps"] != adam_eps(cfg):
        errs.append(f"{name} uses its AdamW's eps {adam_eps(cfg):g} (hard-coded): train.eps {t['eps']:g} cannot be honoured")
    if t["precision"] == "fp32":
        errs.append(
            f"{name} trains in bf16 (its recipe's mixed precision): train.precision fp32 cannot be honoured (set auto or bf16)"
        )
    if t["skip_nonfinite_steps"]:
        errs.append(
            f"{name} does not skip non-finite steps: train.skip_nonfinite_steps {t['skip_nonfinite_steps']} cannot be honoured (set 0)"
        )
    if t["max_steps"] % t["save_interval"]:
        errs.append(
            f"{name} saves every --checkpoint_freq steps and not at the end: train.max_steps "
            f"{t['max_steps']} must be a multiple of train.save_interval {t['save_interval']}"
        )
    if errs:
        raise NeuronConfigError("neuron backend: " + "; ".join(errs))
    return {
        "script": kind,
        "world": world,
        "dp": dp,
        "train_batch_size": per_dp,
        "num_microbatches": per_dp // micro if kind == "tp_pp" else 1,
        "grad_accum_usteps": per_dp // micro if kind == "tp_zero1" else 1,
    }


def model_dims(cfg: dict) -> Dims | None:
    """The model's shapes before any job: model.init_from's config.json (a Hub base once downloaded),
    else the model section (the presets carry their base's shape; vocab unknown until the tokenizer
    exists: neuron-shard checks it with the real config)."""
    found = cfgmod.base_config_json(cfg)
    if found is not None:
        return Dims.from_hf_config(json.loads(found.read_text()))
    m = cfg["model"]
    return Dims(
        layers=m["num_hidden_layers"],
        hidden=m["hidden_size"],
        heads=m["num_attention_heads"],
        kv_heads=m["num_key_value_heads"],
        intermediate=m["intermediate_size"],
        vocab=cfg["parallel"]["tp"],
        tied=m["tie_word_embeddings"],
    )


def cores_per_node(cfg: dict) -> int:
    """NeuronCores of one node: trn1.32xlarge 32; trn2.48xlarge 64 logical cores at LNC 2 (its default),
    128 at NEURON_LOGICAL_NC_CONFIG=1 (neuron.env)."""
    if cfg["neuron"]["hw_backend"] == "trn1":
        return 32
    return 128 if str(cfg["neuron"]["env"].get("NEURON_LOGICAL_NC_CONFIG")) == "1" else 64


def check_config(cfg: dict) -> None:
    """Layout against the model and the batch arithmetic: every problem before any job runs."""
    nproc, cores = cfg["parallel"]["nproc_per_node"], cores_per_node(cfg)
    if nproc > cores:
        raise NeuronConfigError(
            f"parallel.nproc_per_node {nproc} is more processes than a {cfg['neuron']['hw_backend']} node has "
            f"NeuronCores ({cores}; neuron.hw_backend"
            + ("; 128 at LNC 1: neuron.env NEURON_LOGICAL_NC_CONFIG '1')" if cores == 64 else ")")
        )
    d = model_dims(cfg)
    if d is not None:
        try:
            layout_of(cfg).check(d)
        except LayoutError as exc:
            if cfg["model"]["init_from"] and cfgmod.base_config_json(cfg) is None:
                raise LayoutError(f"{exc} (model.* sizes: {cfg['model']['init_from']} is not downloaded yet)") from None
            raise
    batch_plan(cfg)


def config_problems(cfg: dict) -> list[str]:
    """check_config's verdict as a list of problems (llmpipe.config.validate runs it)."""
    try:
        check_config(cfg)
    except (NeuronConfigError, LayoutError) as exc:
        return [str(exc)]
    return []


def compile_cache(cfg: dict) -> str:
    return cfg["neuron"]["compile_cache"] or str(Path(cfg["results_dir"]) / "neuron-compile-cache")


def environment(cfg: dict) -> dict[str, str]:
    """The recipes' environment (tp/pp family) with the compile cache on shared storage."""
    n = cfg["neuron"]
    cache = compile_cache(cfg)
    flags = list(n["cc_flags"])
    env = {}
    if cache.startswith("s3://"):
        env["NEURON_COMPILE_CACHE_URL"] = cache
    else:
        flags.append(f"--cache_dir={cache}")
    script_dir = script_path(cfg)
    zero1 = script_kind(cfg) == "tp_zero1"  # its recipe: 3 in-flight requests, 64 arenas, its own precision
    env.update(
        {
            "NEURON_CC_FLAGS": " ".join(flags),
            "NEURON_FUSE_SOFTMAX": "1",
            "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS": "3" if zero1 else "7",
            "MALLOC_ARENA_MAX": "64" if zero1 else "128",
            **({} if zero1 else {"XLA_DOWNCAST_BF16": "1"}),
            "XLA_DISABLE_FUNCTIONALIZATION": "0",
            "FI_EFA_USE_DEVICE_RDMA": "1",
            "FI_PROVIDER": "efa",
            "FI_EFA_FORK_SAFE": "1",
            # run_llama_nxd.py imports logger (its folder) and modeling_llama_nxd, training_utils (the parent)
            "PYTHONPATH": f"{script_dir.parent}:{script_dir.parent.parent}",
        }
    )
    env.update(n["env"])
    return env


def trainer_args(
    cfg: dict, init: str, data: str, checkpoint_dir: str, metrics: str, tb_dir: str, phase: str = "train"
) -> list[str]:
    """The trainer script and its flags (real names only: the tutorials' --pretrained_weight_dir,
    --num_kept_checkpoints, --convert_from_full_model are silently ignored by run_llama_nxd.py)."""
    flags = (zero1_flags if script_kind(cfg) == "tp_zero1" else tp_pp_flags)(
        cfg, init, data, checkpoint_dir, metrics, tb_dir, phase == "precompile"
    )
    out = [str(script_path(cfg))]
    for k, v in flags.items():
        out += [k] if v is True else [k, str(v)]  # True: a store_true switch
    return out


def loading_step(t: dict, extract: bool) -> str:
    """Training resumes its newest step: under train.resume false, prepare() removed the old run's steps
    once, so a retry resumes the restart. Extraction (precompile, before prepare) loads none then."""
    return "-1" if extract and not t["resume"] else "latest_if_exists"


def tp_pp_flags(cfg: dict, init: str, data: str, checkpoint_dir: str, metrics: str, tb_dir: str, extract: bool) -> dict:
    t, n, p = cfg["train"], cfg["neuron"], cfg["parallel"]
    layout = layout_of(cfg)
    b = batch_plan(cfg)
    return {
        "--training_dir": f"{data}/train",
        "--training_config": init,
        "--tensor_parallel_size": p["tp"],
        "--pipeline_parallel_size": p["pp"],
        "--virtual_pipeline_size": n["vpp"],
        "--kv_replicator": n["kv_size_multiplier"],
        "--qkv_linear": int(layout.qkv_linear),
        "--fuse_qkv": int(layout.fuse_qkv),
        "--num_microbatches": b["num_microbatches"],
        "--train_batch_size": b["train_batch_size"],
        "--seq_len": t["seq_len"],
        "--max_steps": n["extract_steps"] if extract else t["max_steps"],
        "--lr": t["lr"],
        "--min_lr": t["min_lr"],
        "--warmup_steps": t["warmup_steps"],
        "--constant_steps": 0,
        "--beta1": t["beta1"],
        "--beta2": t["beta2"],
        "--weight_decay": t["weight_decay"],
        "--seed": t["seed"],
        "--use_zero1_optimizer": int(p["zero"] == 1),
        "--use_fp32_optimizer": int(n["fp32_optimizer"]),
        "--use_meta_device_init": int(n["meta_device_init"]),
        "--use_selective_checkpoint": int(p["activation_checkpointing"] == "selective"),
        "--use_sequence_parallel": int(n["sequence_parallel"]),
        "--use_flash_attention": int(n["flash_attention"]),
        "--checkpoint_dir": checkpoint_dir,
        "--checkpoint_freq": -1 if extract else t["save_interval"],
        "--num_kept_checkpoint": t["keep_checkpoints"],
        "--loading_step": loading_step(t, extract),
        "--pretrained_weight": 1,
        "--save_load_xser": int(n["save_xser"]),
        "--tb_dir": tb_dir,
        "--metrics_file": metrics,
        "--logging_interval": t["log_interval"],
    }


def zero1_flags(cfg: dict, init: str, data: str, checkpoint_dir: str, metrics: str, tb_dir: str, extract: bool) -> dict:
    """tp_zero1_llama_hf_pretrain.py: switches are store_true (present = on), the rest valued."""
    t, n, p = cfg["train"], cfg["neuron"], cfg["parallel"]
    layout = layout_of(cfg)
    b = batch_plan(cfg)
    switches = {
        "--use_mix_precision": n["fp32_optimizer"],
        "--use_zero_1": p["zero"] == 1,
        "--sequence_parallel_enabled": n["sequence_parallel"],
        "--selective_checkpoint_enabled": p["activation_checkpointing"] == "selective",  # off = every layer
        "--use_meta_device_init": n["meta_device_init"],
        "--qkv_linear": layout.qkv_linear,
        "--pretrained_weight": True,
        "--print_grad_norm": True,
    }
    return {
        "--model_path": init,
        "--data_dir": f"{data}/train",
        "--output_dir": tb_dir,
        "--metrics_file": metrics,
        "--tensor_parallel_size": p["tp"],
        "--kv_replicator": n["kv_size_multiplier"],
        "--fuse_qkv": int(layout.fuse_qkv),
        "--use_flash_attention": int(n["flash_attention"]),
        "--batch_size": t["micro_batch_size"],
        "--grad_accum_usteps": b["grad_accum_usteps"],
        "--seq_len": t["seq_len"],
        "--max_steps": t["max_steps"],
        "--steps_this_run": n["extract_steps"] if extract else -1,
        "--lr": t["lr"],
        "--warmup_steps": t["warmup_steps"],
        "--beta1": t["beta1"],
        "--beta2": t["beta2"],
        "--weight_decay": t["weight_decay"],
        "--seed": t["seed"],
        "--checkpoint_dir": checkpoint_dir,
        "--checkpoint_freq": -1 if extract else t["save_interval"],
        "--num_kept_checkpoint": t["keep_checkpoints"],
        "--loading_step": loading_step(t, extract),
        "--logging_interval": t["log_interval"],
        **{k: True for k, on in switches.items() if on},
    }


def command(cfg: dict, args: list[str], alloc: launch.Allocation | None, phase: str, python: str | None = None) -> list[str]:
    """The launch (llmpipe.launch.plan) of `args`; precompile wraps each node's command."""
    t, n, p = cfg["train"], cfg["neuron"], cfg["parallel"]
    python = python or n["python"]
    cmd = launch.plan(
        args,
        p["nproc_per_node"],
        p["nnodes"],
        t["launcher"],
        alloc,
        n["master_port"],
        python,
        auto_resume=t["slurm_auto_resume"] and phase == "train",
    )
    if phase == "precompile":
        at = cmd.index(python)  # srun [options] PYTHON -m llmpipe launch --node-task ...  |  PYTHON -m torch.distributed.run ...
        cmd = cmd[:at] + [compile_wrapper(python)] + cmd[at:]
    return cmd


def compile_wrapper(python: str) -> str:
    """neuron_parallel_compile beside neuron.python (its venv, which the job does not activate), else by name
    from PATH (where llmpipe doctor also looks)."""
    beside = Path(python).parent / COMPILE_WRAPPER
    return str(beside) if beside.is_file() else COMPILE_WRAPPER


def render(env: dict[str, str], cmd: list[str]) -> str:
    """The environment and command as a shell script (dry runs, golden tests, the job log)."""
    lines = [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    return "\n".join(lines + [shlex.join(cmd)]) + "\n"


def check_inputs(cfg: dict, init: str, data: str, checkpoint_dir: str) -> None:
    n, t = cfg["neuron"], cfg["train"]
    script = script_path(cfg)
    if not script.is_file():
        raise NeuronConfigError(
            f"{script} not found: check out a neuronx-distributed release into neuron.nxd_dir "
            f"(git clone --branch <release tag> https://github.com/aws-neuron/neuronx-distributed "
            f"{n['nxd_dir']})"
        )
    view = json.loads((Path(data) / "view.json").read_text())
    if view["seq_len"] != t["seq_len"]:
        raise NeuronConfigError(f"{data} has rows of {view['seq_len']} tokens but train.seq_len is {t['seq_len']}")
    if not (Path(init) / "config.json").is_file():
        raise NeuronConfigError(f"{init}/config.json missing (run_llama_nxd.py --training_config)")
    if not (Path(checkpoint_dir) / "pretrained_weight" / "model").is_dir():
        raise NeuronConfigError(f"{checkpoint_dir}/pretrained_weight/model missing: run neuron-shard first")


def finished(cfg: dict, ckpt: Path, out: str, env: dict, cmd: list[str]) -> bool:
    """After prepare() (the fingerprint checked, a restart begun): a run whose step_<max_steps> is complete
    launches nothing (NxD's trainers would take a whole allocation, resume, and train a step past the end
    before their exit check); its summary is written again. True when so."""
    steps = complete_steps(ckpt)
    if not steps or steps[-1] < cfg["train"]["max_steps"]:
        return False
    log.info("%s has step_%d complete: the run is finished, nothing launched", ckpt, steps[-1])
    resume_view.clear(ckpt)
    write_json(out, {**summary(cfg, env, cmd, "train"), "last_step": steps[-1], "launched": False})
    return True


def summary(cfg: dict, env: dict, cmd: list[str], phase: str) -> dict:
    return {
        "phase": phase,
        "command": cmd,
        "env": env,
        "compile_cache": compile_cache(cfg),
        "cc_flags": env["NEURON_CC_FLAGS"],
        "nodes": cfg["parallel"]["nnodes"],
        **batch_plan(cfg),
    }


def main(argv: list[str] | None = None, phase: str = "train") -> None:
    p = argparse.ArgumentParser(
        prog=f"llmpipe neuron-{phase}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", required=True)
    p.add_argument("--init", required=True, help="HF model folder whose config.json the trainer reads")
    p.add_argument("--data", required=True, help="the hf view (datasets.save_to_disk; its train/ split is read)")
    p.add_argument("--checkpoint-dir", required=True, help="NxD checkpoint dir (pretrained_weight/ from neuron-shard)")
    p.add_argument("--metrics", required=True, help="run_llama_nxd.py --metrics_file")
    p.add_argument("--tb-dir", required=True)
    p.add_argument("--out", required=True, help="JSON written on success (precompile marker / training summary)")
    p.add_argument("--dry-run", action="store_true", help="print the environment and the command; run nothing")
    args = p.parse_args(argv)
    cfg = cfgmod.load(args.config)
    try:
        targs = trainer_args(cfg, args.init, args.data, args.checkpoint_dir, args.metrics, args.tb_dir, phase)
        env = environment(cfg)
        t = cfg["train"]
        alloc = None if t["launcher"] == "local" else launch.job_allocation(os.environ, t["launcher"], cfg["parallel"]["nnodes"])
        cmd = command(cfg, targs, alloc, phase)
        if args.dry_run:
            print(render(env, cmd), end="")
            return
        check_inputs(cfg, args.init, args.data, args.checkpoint_dir)
        if phase == "train":
            prepare(cfg, Path(args.init), Path(args.data), Path(args.checkpoint_dir))
            if finished(cfg, Path(args.checkpoint_dir), args.out, env, cmd):
                return
        if phase == "train" and script_kind(cfg) == "tp_zero1":  # it skips no rows on resume: a view that does
            b, t = batch_plan(cfg), cfg["train"]
            loop = (b["dp"], t["micro_batch_size"], b["grad_accum_usteps"], t["max_steps"], t["slurm_auto_resume"])
            data = resume_view.data_for(args.data, args.checkpoint_dir, *loop)
            targs = trainer_args(cfg, args.init, str(data), args.checkpoint_dir, args.metrics, args.tb_dir, phase)
            cmd = command(cfg, targs, alloc, phase)
    except (ValueError, OSError, subprocess.CalledProcessError, launch.LaunchError, CheckpointError) as exc:
        raise SystemExit(f"llmpipe neuron-{phase}: {exc}") from None
    print(render(env, cmd), file=sys.stderr, flush=True)
    run_env = dict(os.environ)
    run_env.update({**env, "PYTHONPATH": env["PYTHONPATH"] + ":" + run_env.get("PYTHONPATH", "")})
    if cmd[0] == "srun":
        run_env = launch.srun_env(run_env)
    Path(args.tb_dir).mkdir(parents=True, exist_ok=True)
    rc = subprocess.call(cmd, env=run_env)
    if rc:
        raise SystemExit(f"llmpipe neuron-{phase}: the {phase} command exited with {rc}")
    record = summary(cfg, env, cmd, phase)
    if phase == "train":
        steps = complete_steps(Path(args.checkpoint_dir))
        if not steps or steps[-1] < cfg["train"]["max_steps"]:
            raise SystemExit(
                f"llmpipe neuron-train: the trainer exited 0 but {args.checkpoint_dir} has no complete "
                f"step_{cfg['train']['max_steps']} (complete: {steps})"
            )
        record["last_step"] = steps[-1]
        resume_view.clear(args.checkpoint_dir)  # read by no later run
    write_json(args.out, record)
