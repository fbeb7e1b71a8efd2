"""Hardware options: the price and speed table (llmpipe/hardware.yaml), and one option's time, cost and
memory fit under the layout training runs."""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from llmpipe.plan.arithmetic import GIB, Shape, memory

HARDWARE_PATH = Path(__file__).resolve().parents[1] / "hardware.yaml"
RESERVED_FRACTION = 0.10  # of HBM, for the runtime, communication buffers and fragmentation


def load_hardware(plan_cfg: dict) -> dict:
    """The hardware table, plan.hardware_file merged over it, restricted to plan.hardware."""
    table = yaml.safe_load(HARDWARE_PATH.read_text())
    if plan_cfg["hardware_file"]:
        path = Path(plan_cfg["hardware_file"])
        if not path.is_file():
            raise FileNotFoundError(f"plan.hardware_file not found: {path}")
        extra = yaml.safe_load(path.read_text()) or {}
        if not isinstance(extra, dict):
            raise ValueError(f"{path}: expected a mapping of hardware name -> fields")
        for name, fields in extra.items():
            table[name] = {**table.get(name, {}), **(fields or {})}
    need = ("devices", "peak_tflops", "hbm_gib", "price_per_hour", "mfu")
    for name, spec in table.items():
        bad = [k for k in need if not isinstance(spec.get(k), (int, float)) or spec[k] <= 0]
        if bad:
            raise ValueError(f"hardware {name!r}: {', '.join(bad)} must be positive numbers")
    wanted = plan_cfg["hardware"] or list(table)
    unknown = [n for n in wanted if n not in table]
    if unknown:
        raise ValueError(f"unknown plan.hardware {', '.join(unknown)}; the table has: {', '.join(table)}")
    return {n: table[n] for n in wanted}


def option(name: str, spec: dict, cfg: dict, layout: dict, shape: Shape, n_params: int, total_flops: float) -> dict:
    """Time, cost and memory fit of one hardware option under the layout training runs."""
    p, t = cfg["plan"], cfg["train"]
    per_node = layout["processes_per_node"] or spec["devices"]
    instances = layout["nodes"]
    devices = per_node * instances
    mp = layout["tp"] * layout["pp"]
    mfu = p["mfu"] if p["mfu"] is not None else spec["mfu"]
    seconds = total_flops / (devices * spec["peak_tflops"] * 1e12 * mfu)
    row = {
        "name": name,
        "accelerator": spec.get("accelerator", ""),
        "instances": instances,
        "devices": devices,
        "devices_per_instance": spec["devices"],
        "processes_per_instance": per_node,
        "peak_tflops": spec["peak_tflops"],
        "mfu": mfu,
        "price_per_hour": spec["price_per_hour"],
        "hours": seconds / 3600,
        "cost_usd": seconds / 3600 * spec["price_per_hour"] * instances,
        "hbm_gib": spec["hbm_gib"],
        "warnings": [],
    }
    if per_node > spec["devices"]:
        row["warnings"].append(
            f"{name}: {per_node} processes per node (parallel.nproc_per_node) but "
            f"the instance has {spec['devices']} devices; no layout"
        )
        row.update(dp=None, grad_accum=None, memory_gib=None, fits=None)
        return row
    if per_node < spec["devices"]:
        row["warnings"].append(
            f"{name}: training uses {per_node} of the instance's {spec['devices']} devices (parallel.nproc_per_node = {per_node})"
        )
    if devices % mp:
        row["warnings"].append(f"{name}: tp x pp = {mp} does not divide {devices} devices; no layout")
        row.update(dp=None, grad_accum=None, memory_gib=None, fits=None)
        return row
    dp = devices // mp
    micro, gb = t["micro_batch_size"], t["global_batch_size"]
    accum = gb / (micro * dp)
    if gb % (micro * dp):
        row["warnings"].append(f"{name}: global_batch_size {gb} is not a multiple of micro_batch_size {micro} x dp {dp}")
    mem = memory(
        shape,
        n_params,
        t["seq_len"],
        micro,
        math.ceil(accum),
        layout["tp"],
        layout["pp"],
        dp,
        layout["zero"],
        layout["activation_checkpointing"],
    )
    usable = spec["hbm_gib"] * GIB * (1 - RESERVED_FRACTION)
    fits = mem["total"] <= usable
    if not fits:
        row["warnings"].append(
            f"{name}: does not fit: {mem['total'] / GIB:.1f} GiB per device > {usable / GIB:.1f} GiB usable of "
            f"{spec['hbm_gib']} GiB; raise ZeRO / tp / pp, enable activation checkpointing or lower micro_batch_size"
        )
    row.update(
        dp=dp,
        grad_accum=accum,
        memory_gib={k: v / GIB for k, v in mem.items()},
        memory_bytes=mem,
        usable_gib=usable / GIB,
        fits=fits,
    )
    return row
