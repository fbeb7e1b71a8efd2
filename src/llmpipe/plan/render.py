"""plan.md: the summary and the hardware table (also used by the report)."""

from __future__ import annotations

import yaml

from llmpipe.plan.arithmetic import duration as _duration


def _num(x: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.3g} {unit}"
    return f"{x:.3g}"


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
