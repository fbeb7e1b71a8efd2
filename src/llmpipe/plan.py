"""plan: tokens, steps, training FLOPs, wall time, cost and per-device memory, before anything runs.

  llmpipe plan --config config/config.yaml [--config config/presets/llama-2-7b.yaml] [--out plan.json]

Tokens come from the packed view (view.json: rows x seq_len, counted), else the token store (counted
before packing), else an estimate (corpus bytes x tokens per byte measured on a sample with the run's
tokenizer; see llmpipe.plan_tokens). Formulas (Llama shapes; d = hidden, L = layers, s = seq_len):

  steps        plan.tokens: ceil(tokens / (global_batch x s)); plan.epochs: ceil(epochs x train_rows /
               global_batch); else train.max_steps
  FLOPs/token  6 N_matmul + 12 L (heads x head_dim) s        (fwd + bwd; PaLM appendix B)
               N_matmul = parameters - input embedding (a lookup, not a matmul; none when tied)
  time, cost   FLOPs / (devices x peak x MFU); hours x price_per_hour x instances
  memory       bf16 weights 2 B + bf16 grads 2 B + fp32 master/Adam m/v 12 B per parameter, over
               tp x pp, ZeRO stage over dp; bf16 activations saved for backward per token per layer
               2 (4d + 2 q + 2 kv + 3 ffn) B (q = heads x head_dim, kv = kv_heads x head_dim; flash
               attention, sequence parallel: / tp), x layers per stage x micro batches in flight
               (min(pp, grad accumulation)); with checkpointing 2 d B per layer + one layer's full set;
               selective (NxD: attention and MLP recomputed) 2 (4d + 2 q + 2 kv) B per layer;
               + fp32 logits 4 s V B / tp; fits if <= 90 % of HBM.
  layout       the one training runs: the parallel section (llmpipe.parallelism), with the backend's
               values for what it leaves null.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import struct
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from llmpipe import config as cfgmod
from llmpipe import parallelism
from llmpipe.io import atomic_path, write_json
from llmpipe.profiles import merge

log = logging.getLogger(__name__)

HARDWARE_PATH = Path(__file__).with_name("hardware.yaml")
GIB = 2**30
RESERVED_FRACTION = 0.10  # of HBM, for the runtime, communication buffers and fragmentation
MANY_EPOCHS = 4.0  # warn above this many passes over the data


@dataclass(frozen=True)
class Shape:
    """A Llama-style decoder (HF config.json names)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool

    @classmethod
    def from_hf(cls, conf: dict) -> Shape:
        need = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
        missing = [k for k in need if k not in conf]
        if missing:
            raise ValueError(f"model config lacks {', '.join(missing)}: the plan needs a Llama-style config.json")
        heads = conf["num_attention_heads"]
        return cls(
            conf["vocab_size"],
            conf["hidden_size"],
            conf["intermediate_size"],
            conf["num_hidden_layers"],
            heads,
            conf.get("num_key_value_heads") or heads,
            conf.get("head_dim") or conf["hidden_size"] // heads,
            bool(conf.get("tie_word_embeddings", False)),
        )


def parameters(s: Shape) -> int:
    """Llama parameter count: embeddings (+ untied LM head), per layer q/k/v/o + SwiGLU MLP + 2 RMSNorms, final norm."""
    d, q, kv = s.hidden_size, s.num_attention_heads * s.head_dim, s.num_key_value_heads * s.head_dim
    layer = d * q + 2 * d * kv + q * d + 3 * d * s.intermediate_size + 2 * d
    return s.vocab_size * d * (1 if s.tie_word_embeddings else 2) + s.num_hidden_layers * layer + d


def matmul_parameters(s: Shape, total: int) -> int:
    return total - (0 if s.tie_word_embeddings else s.vocab_size * s.hidden_size)


def flops_per_token(s: Shape, n_matmul: int, seq_len: int) -> int:
    return 6 * n_matmul + 12 * s.num_hidden_layers * s.num_attention_heads * s.head_dim * seq_len


def checkpoint_parameters(folder: Path) -> int | None:
    """Parameters stored in a folder's *.safetensors (headers only), or None if it has none."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        with f.open("rb") as fh:
            header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
        total += sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    return total


def activation_bytes_per_token_layer(s: Shape, selective: bool = False) -> int:
    """bf16 tensors a layer saves for backward, per token: two norm inputs, two matmul inputs, q, k, v,
    attention output (flash attention: no s x s scores), gate, up and down-projection input (selective
    checkpointing recomputes the MLP: no gate / up / down inputs)."""
    q, kv = s.num_attention_heads * s.head_dim, s.num_key_value_heads * s.head_dim
    return 2 * (4 * s.hidden_size + 2 * q + 2 * kv + (0 if selective else 3 * s.intermediate_size))


def memory(
    s: Shape, n_params: int, seq_len: int, micro: int, accum: int, tp: int, pp: int, dp: int, zero: int, checkpointing: bool | str
) -> dict:
    """Bytes per device (see the module docstring for the model)."""
    shard = n_params / (tp * pp)
    weights = 2 * shard / (dp if zero >= 3 else 1)
    grads = 2 * shard / (dp if zero >= 2 else 1)
    optimizer = 12 * shard / (dp if zero >= 1 else 1)
    tokens = seq_len * micro
    layers = math.ceil(s.num_hidden_layers / pp)
    in_flight = min(pp, max(1, accum))
    full = activation_bytes_per_token_layer(s)
    if checkpointing == "selective":
        acts = tokens * layers * in_flight * activation_bytes_per_token_layer(s, selective=True) / tp
    elif checkpointing:
        acts = tokens * (layers * in_flight * 2 * s.hidden_size + full) / tp
    else:
        acts = tokens * layers * in_flight * full / tp
    logits = 4 * tokens * s.vocab_size / tp
    parts = {"weights": weights, "grads": grads, "optimizer": optimizer, "activations": acts, "logits": logits}
    return {**parts, "total": sum(parts.values())}


# ---------------------------------------------------------------- inputs


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


def data_from_view(view_dir: Path, seq_len: int) -> dict:
    info = json.loads((view_dir / "view.json").read_text())
    if info["seq_len"] != seq_len:
        raise ValueError(f"{view_dir} was packed for seq_len {info['seq_len']}, train.seq_len is {seq_len}")
    train, val = info["train"], info["val"]
    return {
        "source": "packed view",
        "path": str(view_dir),
        "train_rows": train["rows"],
        "tokens_per_epoch": train["rows"] * seq_len,
        "train_tokens_packed": train["tokens_packed"],
        "dropped_tokens": train["dropped_tokens"],
        "val_tokens": val["tokens_packed"],
    }


def rows_for(tokens: int, seq_len: int, remainder: str) -> int:
    return tokens // seq_len if remainder == "drop" else -(-tokens // seq_len)


def data_from_store(manifest: Path, cfg: dict) -> dict:
    totals = json.loads(manifest.read_text())["totals"]
    seq_len = cfg["train"]["seq_len"]
    rows = rows_for(totals["train"]["tokens"], seq_len, cfg["data"]["remainder"])
    return {
        "source": "token store (before packing)",
        "path": str(manifest),
        "train_rows": rows,
        "tokens_per_epoch": rows * seq_len,
        "val_tokens": totals["val"]["tokens"],
    }


def shape_from_config(cfg: dict, tokenizer_dir: Path | None) -> tuple[Shape, str]:
    """The model the init rule would build: config sizes, the tokenizer's vocab rounded up to vocab_multiple.
    With a base model (model.init_from): its config.json, or the config's sizes until it is downloaded."""
    m = cfg["model"]
    if m["init_from"]:
        found = cfgmod.base_config_json(cfg)
        if found is not None:
            return Shape.from_hf(json.loads(found.read_text())), str(found)
        return (
            sized_shape(m, cfg["tokenizer"]["vocab_size"]),
            f"model sizes and tokenizer.vocab_size from the config ({m['init_from']} not downloaded yet)",
        )
    if cfg["tokenizer"]["source"] != "train" or tokenizer_dir is not None:
        from llmpipe.data.tokenizer import load_backend

        tok = tokenizer_dir or tokenizer_folder(cfg)
        if tok is None:
            raise ValueError(
                f"tokenizer.source {cfg['tokenizer']['source']!r} is a Hub id not downloaded yet: run "
                "the tokenizer stage first (snakemake <results>/<run>/tokenizer) and plan again"
            )
        vocab, where = load_backend(tok).get_vocab_size(with_added_tokens=True), str(tok)
    else:
        vocab, where = cfg["tokenizer"]["vocab_size"], "tokenizer.vocab_size"
    return sized_shape(m, vocab), f"model: sizes, vocab from {where}"


def sized_shape(m: dict, vocab: int) -> Shape:
    """The Llama of the config's model.* sizes, its vocab rounded up to model.vocab_multiple."""
    heads = m["num_attention_heads"]
    return Shape(
        -(-vocab // m["vocab_multiple"]) * m["vocab_multiple"],
        m["hidden_size"],
        m["intermediate_size"],
        m["num_hidden_layers"],
        heads,
        m["num_key_value_heads"],
        m["hidden_size"] // heads,
        m["tie_word_embeddings"],
    )


# ---------------------------------------------------------------- the plan


def schedule(cfg: dict, train_rows: int) -> dict:
    t, p = cfg["train"], cfg["plan"]
    if train_rows is None and p["epochs"] is not None:
        raise ValueError("plan.epochs needs the data's size: build the token store first, or set plan.tokens")
    if train_rows is not None and train_rows < 1:
        raise ValueError(f"the train split has no full row of train.seq_len {t['seq_len']} tokens")
    if p["tokens"] is not None and p["epochs"] is not None:
        raise ValueError("set plan.tokens or plan.epochs, not both")
    gb, seq = t["global_batch_size"], t["seq_len"]
    per_step = gb * seq
    if p["tokens"] is not None:
        steps, source = -(-p["tokens"] // per_step), "plan.tokens"
    elif p["epochs"] is not None:
        steps, source = math.ceil(p["epochs"] * train_rows / gb), "plan.epochs"
    else:
        steps, source = t["max_steps"], "train.max_steps"
    steps = max(1, steps)
    warmup = round(p["warmup_fraction"] * steps) if p["warmup_fraction"] is not None else t["warmup_steps"]
    out = {
        "steps": steps,
        "steps_from": source,
        "global_batch_size": gb,
        "micro_batch_size": t["micro_batch_size"],
        "seq_len": seq,
        "tokens_per_step": per_step,
        "tokens": steps * per_step,
        "epochs": steps * gb / train_rows if train_rows else None,
        "warmup_steps": warmup,
        "warmup_fraction": warmup / steps,
        "train_max_steps": t["max_steps"],
        "overlay": None,
    }
    if steps != t["max_steps"] or warmup != t["warmup_steps"]:
        out["overlay"] = {"train": {"max_steps": steps, "warmup_steps": warmup}}
    return out


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


# ---------------------------------------------------------------- rendering


def _num(x: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.3g} {unit}"
    return f"{x:.3g}"


def _duration(hours: float) -> str:
    seconds = hours * 3600
    if seconds < 120:
        return f"{seconds:.1f} s"
    if hours < 2:
        return f"{seconds / 60:.1f} min"
    if hours < 48:
        return f"{hours:.1f} h"
    return f"{hours / 24:.1f} d"


def summary_rows(plan: dict) -> list[tuple[str, str]]:
    m, d, s, f, lay = plan["model"], plan["data"], plan["schedule"], plan["flops"], plan["layout"]
    sh = m["shape"]
    return [
        (
            "model",
            f"{_num(m['parameters'])} parameters ({m['parameters']:,}): {sh['num_hidden_layers']} layers, hidden "
            f"{sh['hidden_size']}, heads {sh['num_attention_heads']}/{sh['num_key_value_heads']}, ffn "
            f"{sh['intermediate_size']}, vocab {sh['vocab_size']:,}",
        ),
        (
            "data",
            f"unknown: {d['source']}"
            if d["train_rows"] is None
            else f"{d['tokens_per_epoch']:,} train tokens per epoch = {d['train_rows']:,} rows x {s['seq_len']} "
            f"({d['source']})" + (f"; val {d['val_tokens']:,} tokens" if d.get("val_tokens") is not None else ""),
        ),
        (
            "schedule",
            f"{s['steps']:,} steps ({s['steps_from']}) x {s['global_batch_size']} sequences x {s['seq_len']} = "
            f"{s['tokens']:,} tokens = "
            + (f"{s['epochs']:.3g}" if s["epochs"] is not None else "?")
            + f" epochs; warmup {s['warmup_steps']:,} steps "
            f"({s['warmup_fraction']:.1%})",
        ),
        (
            "compute",
            f"{f['total']:.3g} FLOPs = {s['tokens']:,} tokens x {f['per_token']:,} FLOPs/token "
            f"(6 N_matmul + attention {f['attention_share']:.1%})",
        ),
        (
            "layout",
            f"parallel ({lay['backend']}): tp {lay['tp']} x pp {lay['pp']} x dp; ZeRO {lay['zero']}; "
            f"activation checkpointing {_checkpointing(lay['activation_checkpointing'])}; micro batch "
            f"{s['micro_batch_size']}; {lay['instances']} instance(s) x "
            f"{lay['processes_per_instance'] or 'every device'} process(es)",
        ),
    ]


def _checkpointing(value) -> str:
    return {True: "on", False: "off"}.get(value, str(value))


HARDWARE_HEADER = ("hardware", "devices", "dp x accum", "MFU", "wall time", "$/hour", "cost", "memory/device", "fits")


def hardware_rows(plan: dict) -> list[tuple[str, ...]]:
    out = []
    for r in plan["hardware"]:
        mem = f"{r['memory_gib']['total']:.1f} / {r['hbm_gib']} GiB" if r["memory_gib"] else "-"
        layout = f"{r['dp']} x {r['grad_accum']:g}" if r["dp"] else "-"
        fits = {True: "yes", False: "NO", None: "-"}[r["fits"]]
        out.append(
            (
                r["name"],
                str(r["devices"]),
                layout,
                f"{r['mfu']:.0%}",
                _duration(r["hours"]),
                f"{r['price_per_hour']:,.2f}",
                f"${r['cost_usd']:,.0f}" if r["cost_usd"] >= 10 else f"${r['cost_usd']:.2f}",
                mem,
                fits,
            )
        )
    return out


def markdown(plan: dict) -> str:
    lines = [f"# Plan for run `{plan['run']}`", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in summary_rows(plan)]
    lines += ["", "| " + " | ".join(HARDWARE_HEADER) + " |", "|" + "---|" * len(HARDWARE_HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in hardware_rows(plan)]
    if plan["schedule"]["overlay"]:
        lines += [
            "",
            "Overlay for these steps (`snakemake --configfile overlay.yaml`):",
            "",
            "```yaml",
            yaml.safe_dump(plan["schedule"]["overlay"], sort_keys=False).rstrip(),
            "```",
        ]
    if plan["warnings"]:
        lines += ["", "Warnings:", ""] + [f"- {w}" for w in plan["warnings"]]
    lines += ["", "Assumptions:", ""] + [f"- {a}" for a in plan["assumptions"]]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- CLI


def load_configs(sources: list[str]) -> dict:
    """Config files (or inline JSON) merged in order like snakemake --configfile, then validated."""
    merged: dict = {}
    for src in sources:
        text = str(src)
        if text.lstrip().startswith("{"):
            data = json.loads(text)
        else:
            if not Path(text).is_file():
                raise cfgmod.ConfigError(f"config file not found: {text}")
            data = yaml.safe_load(Path(text).read_text()) or {}
        merged = merge(merged, data)
    return cfgmod.validate(merged)


def tokenizer_folder(cfg: dict) -> Path | None:
    """The local folder holding the configured tokenizer: tokenizer.source itself, or for a Hub id this
    run's tokenizer stage output if it downloaded that repo and revision (None: not trained/fetched yet)."""
    from llmpipe.hub import is_hub_ref, parse_ref

    source = cfg["tokenizer"]["source"]
    if source == "base":  # the base model's own tokenizer: its folder once there
        found = cfgmod.base_config_json(cfg) if cfg["model"]["init_from"] else None
        return found.parent if found is not None else None
    if not is_hub_ref(source):
        return None if source == "train" else Path(source)
    run_tok = cfgmod.run_dir(cfg) / "tokenizer"
    record = run_tok / "hub.json"
    if not record.is_file():
        return None
    got = json.loads(record.read_text())
    repo_id, rev = parse_ref(source)
    return run_tok if (got["repo_id"], got["revision"]) == (repo_id, rev or "main") else None


def _tokenizer_matches(cfg: dict, vocab_size: int, sha256: str) -> bool:
    """Whether a tokenizer (its vocab size and tokenizer.json sha256) is the one this config asks for."""
    if cfg["tokenizer"]["source"] == "train":
        return vocab_size == cfg["tokenizer"]["vocab_size"]
    from llmpipe.data.tokenizer import tokenizer_sha256

    folder = tokenizer_folder(cfg)
    return folder is not None and sha256 == tokenizer_sha256(folder)


def run_outputs(cfg: dict) -> dict:
    """This run's tokenizer, token store, view and init checkpoint, where they exist and match the
    config (an overlay such as a preset may plan another tokenizer, seq_len or model)."""
    run = cfgmod.run_dir(cfg)
    found = {"tokenizer": None, "store": None, "view": None, "model": None}
    tok = run / "tokenizer"
    if (tok / "tokenizer.json").is_file():
        from llmpipe.data.tokenizer import tokenizer_info

        info = tokenizer_info(tok)
        found["tokenizer"] = tok if _tokenizer_matches(cfg, info.vocab_size, info.sha256) else None
    manifest = run / "data" / "tokens" / "manifest.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        if _tokenizer_matches(cfg, m["tokenizer"]["vocab_size"], m["tokenizer"]["sha256"]):
            found["store"] = manifest
            view = run / "data" / "views" / "hf"
            if (view / "view.json").is_file():
                v = json.loads((view / "view.json").read_text())
                if v["seq_len"] == cfg["train"]["seq_len"] and v["store_fingerprint"] == m["fingerprint"]:
                    found["view"] = view
    init = run / "checkpoints" / "init" / "config.json"
    if init.is_file():
        want, _ = shape_from_config(cfg, found["tokenizer"])
        if Shape.from_hf(json.loads(init.read_text())) == want:
            found["model"] = init.parent
    skipped = [k for k, v in found.items() if v is None]
    if skipped:
        log.info("not using this run's %s (absent or built for another config)", ", ".join(skipped))
    return found


def build(
    cfg: dict,
    view: Path | None = None,
    store: Path | None = None,
    model: Path | None = None,
    estimate: bool = False,
    allow_unknown_data: bool = False,
) -> dict:
    """The plan from the best inputs available: given paths, else this run's matching outputs, else estimates.
    allow_unknown_data: without a tokenizer to estimate with (a base model not downloaded yet), plan the
    steps of train.max_steps / plan.tokens with the data's size unknown instead of failing."""
    hardware = load_hardware(cfg["plan"])  # first: a typo there should not wait for an estimate
    explicit = view is not None and model is not None
    found = {"tokenizer": None} if explicit else run_outputs(cfg)
    if not estimate and not explicit:
        view, store, model = view or found["view"], store or found["store"], model or found["model"]
    tok_dir = found["tokenizer"] if cfg["tokenizer"]["source"] == "train" else tokenizer_folder(cfg)
    if view is not None:
        data = data_from_view(Path(view), cfg["train"]["seq_len"])
    elif store is not None:
        data = data_from_store(Path(store), cfg)
    elif cfg["tokenizer"]["source"] != "train" and (tok_dir is None or not Path(tok_dir).is_dir()):
        # another tokenizer would give another count: plan the configured steps, data size unknown
        why = f"tokenizer {cfg['tokenizer']['source']} not available yet (run the tokenizer stage for a count)"
        if not allow_unknown_data:
            raise ValueError(why)
        data = {"source": why + "; steps from the config", "train_rows": None, "tokens_per_epoch": None, "val_tokens": None}
    else:
        from llmpipe.plan_tokens import estimate as estimate_tokens

        est = estimate_tokens(cfg, tok_dir)
        rows = rows_for(est["train_tokens"], cfg["train"]["seq_len"], cfg["data"]["remainder"])
        data = {
            "source": "estimate",
            "train_rows": rows,
            "tokens_per_epoch": rows * cfg["train"]["seq_len"],
            "val_tokens": est["val_tokens"],
            "estimate": est,
        }
    if model is not None:
        model = Path(model)
        folder = model if model.is_dir() else model.parent
        shape, source = Shape.from_hf(json.loads((folder / "config.json").read_text())), str(folder / "config.json")
        counted = checkpoint_parameters(folder)
    else:
        shape, source = shape_from_config(cfg, tok_dir)
        counted = None
    n_params = counted if counted is not None else parameters(shape)
    if counted is not None and counted != parameters(shape):
        log.warning(
            "%s holds %d parameters, the Llama formula gives %d: using the checkpoint's count", source, counted, parameters(shape)
        )
    plan = make_plan(cfg, shape, n_params, data, hardware, source)
    if warning := decompress_warning(cfg["data"]):
        plan["warnings"].append(warning)
    return plan


def decompress_warning(d: dict) -> str | None:
    """With fewer sources than data.num_shards every shard reads every source; spread over several
    tokenize jobs (data.shards_per_job set), a compressed one (no byte ranges to skip to) is
    decompressed whole by every job. Null keeps them in one job that reads each source once."""
    from llmpipe.data.mixture import paths
    from llmpipe.data.readers import HF_PREFIX, _compression
    from llmpipe.data.sources import expand_sources
    from llmpipe.data.tokenize import num_jobs

    try:
        sources = expand_sources(paths(d["sources"]))
    except (OSError, ValueError):  # not there yet: get-data names it
        return None
    packed = [s for s in sources if not s.startswith(HF_PREFIX) and _compression(s)]
    jobs = num_jobs(d, len(sources))
    if not packed or len(sources) >= d["num_shards"] or jobs == 1:
        return None
    return (
        f"{len(sources)} source(s) for data.num_shards {d['num_shards']} in {jobs} tokenize jobs (data.shards_per_job "
        f"{d['shards_per_job']}): each job decompresses all of {', '.join(packed[:3])}{' ...' if len(packed) > 3 else ''}; "
        f"leave data.shards_per_job null (one job reads each source once) or split the corpus into at least {jobs} "
        "files (docs/data.md, Sharding)"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe plan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", required=True, help="config file or inline JSON; repeat to overlay")
    p.add_argument("--view", help="packed hf view folder (view.json: counted tokens); default: this run's, if built")
    p.add_argument("--store", help="token store manifest.json (counted before packing); default: this run's, if built")
    p.add_argument("--model", help="HF model folder or config.json; default: this run's checkpoints/init, if built")
    p.add_argument("--estimate", action="store_true", help="ignore this run's outputs: estimate tokens from the corpus")
    p.add_argument("--out", help="plan.json to write")
    p.add_argument("--markdown", help="plan.md (the table) to write")
    p.add_argument("--overlay", help="write the train.max_steps / warmup_steps overlay the plan derived (YAML)")
    args = p.parse_args(argv)
    try:
        cfg = load_configs(args.config)
        plan = build(cfg, args.view, args.store, args.model, args.estimate, allow_unknown_data=True)
    except (cfgmod.ConfigError, ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"llmpipe plan: {exc}") from None
    text = markdown(plan)
    for w in plan["warnings"]:
        log.warning("%s", w)
    if args.out:
        write_json(args.out, plan)
    if args.markdown:
        with atomic_path(args.markdown) as tmp:
            tmp.write_text(text)
    if args.overlay:
        with atomic_path(args.overlay) as tmp:
            tmp.write_text(yaml.safe_dump(plan["schedule"]["overlay"] or {}, sort_keys=False))
    print(text, end="")
