"""Config checks of the colossal backend, before any job (llmpipe.config.validate runs them)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from llmpipe.parallelism import data_parallel_problems, refuse

# The colossal keys the trainer reads (rule train_colossal passes them: a change reruns it); the others
# (python, launcher, hostfile, master_port) only say how it is launched.
TRAIN_KEYS = ("plugin", "flash_attention", "offload_optim_frac", "offload_param_frac")

# The ZeRO stage each plugin is (3d: parallel.zero 0-2 chooses it).
PLUGIN_ZERO = {"gemini": 3, "gemini_auto": 3, "zero2": 2, "ddp": 0}


def parallel_defaults(cfg: dict) -> dict:
    return {"nproc_per_node": 1, "zero": PLUGIN_ZERO.get(cfg["colossal"]["plugin"], 0), "activation_checkpointing": False}


def layout_of(cfg: dict) -> dict:
    """The colossal section with the parallel layout in the plugin's terms (what the trainer builds)."""
    p, plugin = cfg["parallel"], cfg["colossal"]["plugin"]
    return {
        **cfg["colossal"],
        "tp": p["tp"],
        "pp": p["pp"],
        "zero_stage": p["zero"] if plugin == "3d" else 0,
        "gradient_checkpointing": bool(p["activation_checkpointing"]),
    }


def resume_layout(c: dict) -> dict:
    """The colossal.* part of the resume fingerprint (`c`: layout_of): a checkpoint resumes only under the
    same layout; gemini_auto holds the same state as gemini (switching after an OOM resumes)."""
    layout = {k: c[k] for k in ("plugin", "tp", "pp", "zero_stage")}
    if layout["plugin"] == "gemini_auto":
        layout["plugin"] = "gemini"
    return layout


def resume_sections(cfg: dict) -> dict:
    return {"colossal": resume_layout(layout_of(cfg))}


def problems(cfg: dict) -> list[str]:
    return (
        (layout_problems(cfg) or data_parallel_problems(cfg))
        + model_head_problems(cfg)
        + launcher_problems(cfg)
        + plugin_key_problems(cfg)
    )


def plugin_key_problems(cfg: dict) -> list[str]:
    """Keys one plugin honours and another would drop silently: the offload fractions (Gemini's static
    placement) and, under ddp, tied embeddings (its checkpoint writes the raw state dict to safetensors,
    which refuses two names of one tensor: the run died at its first save)."""
    from llmpipe import config as cfgmod

    c, out = cfg["colossal"], []
    given = [k for k in ("offload_optim_frac", "offload_param_frac") if c[k] is not None]
    if given and c["plugin"] != "gemini":
        out.append(f"'colossal.{given[0]}' applies to plugin gemini only, not {c['plugin']!r} (remove it, or use plugin gemini)")
    if c["plugin"] == "ddp":
        base = cfgmod.base_config_json(cfg) if cfg["model"]["init_from"] else None  # None: a Hub base not downloaded yet
        tied = json.loads(base.read_text()).get("tie_word_embeddings", False) if base else cfg["model"]["tie_word_embeddings"]
        if tied:
            out.append(
                "colossal.plugin ddp cannot checkpoint a model with tied embeddings (ColossalAI saves its state dict to "
                "safetensors, which refuses two names of one tensor): use plugin 3d (tp = pp = 1 trains as ddp) or untie them"
            )
    return out


def layout_problems(cfg: dict) -> list[str]:
    plugin = cfg["colossal"]["plugin"]
    checkpointing = [True, False]  # no selective recompute here
    if plugin == "3d":
        return refuse(cfg, "colossal (plugin 3d)", {"zero": [0, 1, 2], "activation_checkpointing": checkpointing}) + (
            pipeline_problems(cfg)
        )
    allowed = {"tp": [1], "pp": [1], "zero": [PLUGIN_ZERO[plugin]], "activation_checkpointing": checkpointing}
    out = refuse(cfg, f"colossal (plugin {plugin}; tp, pp and a chosen zero need plugin 3d)", allowed)
    skips = cfg["train"]["skip_nonfinite_steps"]
    if plugin.startswith("gemini") and skips:  # a skip would leave the gradients in the weights' chunks
        out.append(
            f"colossal.plugin {plugin} writes gradients into the bf16 weight chunks (reuse_fp16_chunk): a skipped step "
            f"cannot be undone there; train.skip_nonfinite_steps {skips} cannot be honoured (set 0, or plugin zero2 / 3d)"
        )
    return out


def pipeline_problems(cfg: dict) -> list[str]:
    """What ColossalAI's HybridParallelPlugin refuses with pp > 1, named here before any job."""
    p, t = cfg["parallel"], cfg["train"]
    if p["pp"] == 1:
        return []
    out = []
    if p["zero"] > 1:
        out.append(f"colossal plugin 3d with parallel.pp {p['pp']} takes parallel.zero 0 or 1 (ColossalAI), not {p['zero']}")
    dp = max(1, p["nproc_per_node"] * p["nnodes"] // (p["tp"] * p["pp"]))
    micro_batches = t["global_batch_size"] // (t["micro_batch_size"] * dp)
    if micro_batches < p["pp"]:
        out.append(
            f"parallel.pp {p['pp']} needs at least {p['pp']} micro batches a step, train.global_batch_size "
            f"{t['global_batch_size']} gives {micro_batches} (micro_batch_size {t['micro_batch_size']} x data parallel {dp})"
        )
    return out


def head_problems(tp: int, conf: dict, source: str) -> list[str]:
    """ColossalAI's Llama shard policy asserts, at booster.boost on every rank, that parallel.tp divides the
    query and the key/value heads; `conf`: a config.json or the model section, named by `source`. Nothing to
    check at tp 1, or for a config without Llama's head counts (ColossalAI's own policy then decides)."""
    heads = conf.get("num_attention_heads")
    if tp == 1 or heads is None:
        return []
    sizes = {"num_attention_heads": heads, "num_key_value_heads": conf.get("num_key_value_heads") or heads}
    return [
        f"parallel.tp {tp} does not divide {source}{key} {n} (ColossalAI splits the attention heads over the tp ranks)"
        for key, n in sizes.items()
        if n % tp
    ]


def model_head_problems(cfg: dict) -> list[str]:
    """head_problems of the model trained: model.init_from's config.json, else the model.* sizes."""
    from llmpipe import config as cfgmod

    tp = cfg["parallel"]["tp"]
    if tp == 1 or cfg["colossal"]["plugin"] != "3d":  # tp on another plugin is refused by layout_problems
        return []
    if not cfg["model"]["init_from"]:
        return head_problems(tp, cfg["model"], "model.")
    base = cfgmod.base_config_json(cfg)  # None: a Hub base not downloaded yet (the trainer checks its --init)
    return head_problems(tp, json.loads(base.read_text()), "model.init_from's config.json: ") if base else []


def launcher_problems(cfg: dict) -> list[str]:
    c, out = cfg["colossal"], []
    if c["launcher"] != "colossalai":
        return out
    if c["hostfile"] and not Path(c["hostfile"]).is_file():
        out.append(f"'colossal.hostfile' {c['hostfile']!r} does not exist")
    elif c["hostfile"]:  # colossalai run --num_nodes takes the first nnodes hosts
        hosts = [ln for ln in Path(c["hostfile"]).read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        if len(hosts) < cfg["parallel"]["nnodes"]:
            out.append(
                f"'colossal.hostfile' lists {len(hosts)} host(s), fewer than 'parallel.nnodes' {cfg['parallel']['nnodes']}"
            )
    if cfg["parallel"]["nnodes"] > 1 and not c["hostfile"]:
        out.append("'colossal.launcher' colossalai on 'parallel.nnodes' > 1 needs 'colossal.hostfile' (one host per line)")
    if cfg["train"]["slurm_auto_resume"]:
        out.append("'train.slurm_auto_resume' needs srun, but 'colossal.launcher' colossalai starts the processes itself")
    if re.search(r"[^\w./+:-]", cfg["results_dir"]):
        out.append(
            f"'results_dir' ({cfg['results_dir']!r}) has characters `colossalai run` would pass through a shell "
            "unquoted (it joins its arguments into one command line): use colossal.launcher llmpipe, or a plain path"
        )
    return out
