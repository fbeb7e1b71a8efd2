"""The plan itself: schedule, FLOPs, layout, per-hardware time, cost and memory, warnings."""

from __future__ import annotations

import math
from dataclasses import asdict

from llmpipe import parallelism
from llmpipe.plan.arithmetic import Shape, duration, flops_per_token, matmul_parameters
from llmpipe.plan.hardware import RESERVED_FRACTION, option
from llmpipe.plan.schedule import schedule

MANY_EPOCHS = 4.0  # warn above this many passes over the data


def make_plan(cfg: dict, shape: Shape, n_params: int, data: dict, hardware: dict, model_source: str = "") -> dict:
    layout = parallelism.trained(cfg)
    sched = schedule(cfg, data["train_rows"])
    n_mm = matmul_parameters(shape, n_params)
    per_token = flops_per_token(shape, n_mm, sched["seq_len"])
    total = float(per_token) * sched["tokens"]
    warnings = []
    if sched["overlay"] and sched["steps_from"] != "train.max_steps":
        warnings.append(
            f"{sched['steps_from']} gives {sched['steps']} steps (warmup {sched['warmup_steps']}) but "
            f"train.max_steps is {cfg['train']['max_steps']} (warmup {cfg['train']['warmup_steps']}): the "
            "backend trains train.max_steps; apply the plan's overlay (llmpipe plan --overlay FILE)"
        )
    if sched["warmup_steps"] >= sched["steps"]:
        warnings.append(f"warmup ({sched['warmup_steps']} steps) is not shorter than the run ({sched['steps']} steps)")
    rows = data["train_rows"]
    if rows is not None and sched["global_batch_size"] > rows:
        warnings.append(
            f"train.global_batch_size {sched['global_batch_size']} exceeds the {rows} train rows: every step "
            f"repeats rows ({sched['global_batch_size'] / rows:.2f} epochs per step)"
        )
    if sched["epochs"] is not None and sched["epochs"] > MANY_EPOCHS:
        warnings.append(f"{sched['epochs']:.3g} epochs: the data is repeated more than {MANY_EPOCHS:g} times")
    heads, kv, tp, pp = shape.num_attention_heads, shape.num_key_value_heads, layout["tp"], layout["pp"]
    if heads % tp or (kv % tp and tp % kv):
        warnings.append(f"tp {tp} does not split {heads} attention / {kv} key-value heads evenly")
    if shape.num_hidden_layers % pp:
        warnings.append(f"pp {pp} does not divide {shape.num_hidden_layers} layers evenly")
    rows = [option(name, spec, cfg, layout, shape, n_params, total) for name, spec in hardware.items()]
    for r in rows:
        warnings.extend(r["warnings"])
    return {
        "run": cfg["run"],
        "model": {"parameters": n_params, "matmul_parameters": n_mm, "shape": asdict(shape), "source": model_source},
        "data": data,
        "schedule": sched,
        "flops": {
            "per_token": per_token,
            "total": total,
            "attention_share": 1 - 6 * n_mm / per_token,
            "formula": "tokens x (6 N_matmul + 12 L heads head_dim seq_len)",
        },
        "layout": {
            "backend": layout["backend"],
            "tp": tp,
            "pp": pp,
            "zero": layout["zero"],
            "activation_checkpointing": layout["activation_checkpointing"],
            "instances": layout["nodes"],
            "processes_per_instance": layout["processes_per_node"],
            "from": "parallel",
        },
        "hardware": rows,
        "warnings": warnings,
        "assumptions": [
            "bf16 mixed precision with fp32 master weights and AdamW: 16 bytes per parameter before ZeRO",
            f"a device fits when the estimate is <= {1 - RESERVED_FRACTION:.0%} of its HBM",
            "prices are on-demand list prices and MFU values are assumptions (llmpipe/hardware.yaml); "
            "override them with plan.hardware_file and plan.mfu",
        ],
    }


def time_limit_warnings(cfg: dict, plan: dict, limit: dict) -> list[str]:
    """Hardware options (plan.hardware named: where this run trains; not the whole table) whose estimated
    training time exceeds the training rule's runtime. `limit`: rule, minutes, attempts (retries + 1). Slurm
    ends a job at its runtime and a retry resumes from the newest checkpoint, so each attempt loses the
    steps since its last one (no trainer saves on the way out). Sets each row's `attempts_needed`."""
    if not cfg["plan"]["hardware"]:
        return []
    rule, minutes, attempts = limit["rule"], limit["minutes"], limit["attempts"]
    runtime, steps, save = duration(minutes / 60), plan["schedule"]["steps"], cfg["train"]["save_interval"]
    out = []
    for r in plan["hardware"]:
        needed = r["attempts_needed"] = max(1, math.ceil(r["hours"] * 60 / minutes))
        if needed == 1:
            continue
        every = min(save, steps)  # steps from one checkpoint to the next (the last step is always saved)
        save_hours = r["hours"] * every / steps
        said = f"{r['name']}: training is estimated at {duration(r['hours'])} (at MFU {r['mfu']:.0%})"
        if save_hours * 60 >= minutes:
            out.append(
                f"{r['name']}: {every} steps between checkpoints (train.save_interval {save}) take about "
                f"{duration(save_hours)} (at MFU {r['mfu']:.0%}), not less than {rule}'s runtime of {runtime}: a job "
                f"ends before its next checkpoint and every retry starts over from the same one; lower "
                f"train.save_interval below {max(1, int(every * minutes / (save_hours * 60)))}"
            )
        elif needed > attempts:
            out.append(
                f"{said}, more than {rule}'s {attempts} attempt(s) of {runtime} (resources runtime {minutes:g} min, "
                f"retries {attempts - 1}): the run would stop unfinished; raise `resources: {{train: {{runtime: ...}}}}` "
                f"in your config, the profile's retries (to at least {needed - 1}), or lower train.max_steps"
            )
        else:
            out.append(
                f"{said}, longer than {rule}'s runtime of {runtime}: Slurm ends the job and a retry resumes from the "
                f"newest checkpoint (at least {needed} of {attempts} attempts; each redoes up to train.save_interval "
                f"{save} steps, about {duration(save_hours)})"
            )
    return out
