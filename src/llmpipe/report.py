"""report: the items `snakemake --report` shows: loss, learning-rate and throughput curves (PNG, from
metrics.jsonl: tokens/s, model TFLOP/s per device and MFU) and HTML tables of the data statistics, the
plan and the evaluation.

  llmpipe report --metrics M --stats S --plan P --eval E --out DIR
"""

from __future__ import annotations

import argparse
import html
import json
import logging
from pathlib import Path

from llmpipe.io import atomic_path
from llmpipe.plan.render import HARDWARE_HEADER, hardware_rows, summary_rows
from llmpipe.train.metrics import read_records

log = logging.getLogger(__name__)

STYLE = (
    "<style>body{font-family:sans-serif;font-size:14px}table{border-collapse:collapse;margin:8px 0}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}th{background:#f4f4f4}"
    ".warn{color:#a00}</style>"
)


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a metrics.jsonl; none when it is missing (the neuron backend writes nxd_metrics.json)
    or empty (sagemaker-train, when no log line matched sagemaker.loss_regex)."""
    return read_records(Path(path))


def _nothing(path, what: str) -> None:
    """A figure saying what is not there, in place of a curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3), dpi=100)
    ax.text(0.5, 0.5, what, transform=ax.transAxes, ha="center")
    ax.set_axis_off()
    _save(fig, path)


def plot(recs: list[dict], loss_png: str | Path, lr_png: str | Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in recs]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(steps, [r.get("loss") for r in recs], lw=1, label="train loss")  # None: a skipped step, a gap
    val = [r for r in recs if "val_loss" in r]
    if val:
        ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", label="val loss")
    ax.set(xlabel="step", ylabel="loss (nats/token)", title=f"loss {title}".strip())
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, loss_png)
    fig, ax = plt.subplots(figsize=(7, 3), dpi=100)
    ax.plot(steps, [r["lr"] for r in recs], lw=1)
    ax.set(xlabel="step", ylabel="learning rate", title=f"learning rate {title}".strip())
    ax.grid(alpha=0.3)
    _save(fig, lr_png)


def throughput_figure(recs: list[dict], title: str = ""):
    """Per step: tokens/s (all devices), model TFLOP/s per device and MFU (%); MFU only where the
    device's peak is known (llmpipe.devices), a note instead."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(key, scale=1.0):
        known = [r for r in recs if r.get(key) is not None]
        return [r["step"] for r in known], [r[key] * scale for r in known]

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5), dpi=100)
    panels = (
        ("tokens_per_s", 1, "tokens/s", "tokens/s (all devices)"),
        ("tflops_per_device", 1, "model TFLOP/s per device", "model TFLOP/s per device"),
        ("mfu", 100, "MFU", "MFU (%)"),
    )
    for ax, (key, scale, label, ylabel) in zip(axes, panels):
        steps, values = series(key, scale)
        if values:
            ax.plot(steps, values, lw=1, label=label)
        else:
            why = "device peak unknown (CPU?)" if key == "mfu" else "not in the metrics"
            ax.text(0.5, 0.5, f"no {label}: {why}", transform=ax.transAxes, ha="center")
        ax.set(xlabel="step", ylabel=ylabel, title=f"{label} {title}".strip())
        ax.grid(alpha=0.3)
    return fig


def _save(fig, path) -> None:
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.tight_layout()
        fig.savefig(tmp, format="png")
    plt.close(fig)


def _table(rows, header=None) -> str:
    esc = lambda v: html.escape(str(v))  # noqa: E731
    head = "<tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table>{head}{body}</table>"


def _page(title: str, body: str) -> str:
    return f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>{STYLE}</head><body>{body}</body></html>\n"


def _write(path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def data_page(stats: dict) -> str:
    read, tok = stats["read"], stats["tokens"]
    facts = [
        ("documents read", f"{read['documents']:,} ({read['bytes']:,} bytes of text)"),
        ("documents train / val", f"{stats['documents']['train']:,} / {stats['documents']['val']:,}"),
        ("tokens train / val", f"{tok['train']:,} / {tok['val']:,}"),
        ("skipped records", f"{read['skipped_total']:,} {read['skipped'] or ''}"),
        *(
            [("skipped sources", f"{read['sources_skipped_total']:,} {read['sources_skipped']}")]
            if read.get("sources_skipped")
            else []
        ),
        ("tokenizer", f"vocab {stats['tokenizer']['vocab_size']:,}, sha256 {stats['tokenizer']['sha256'][:16]}"),
    ]
    views = []
    for fmt, v in stats.get("views", {}).items():
        for split in ("train", "val"):
            if split not in v:
                continue
            s = v[split]
            if "rows" not in s:  # megatron: whole documents, nothing packed, dropped or padded
                views.append((fmt, split, f"{s['documents']:,} documents", *[f"{s['tokens']:,}"] * 2, "0", "0", "none"))
                continue
            views.append(
                (
                    fmt,
                    split,
                    f"{s['rows']:,}",
                    f"{s['tokens_in']:,}",
                    f"{s['tokens_packed']:,}",
                    f"{s['dropped_tokens']:,}",
                    f"{s['padded_tokens']:,}",
                    s["remainder"],
                )
            )
    mixture = [
        (name, f"{g['target_share']:.1%}", f"{g['share']:.1%}", f"{g['train_tokens']:,}", f"{g['val_tokens']:,}")
        for name, g in stats.get("by_group", {}).items()
    ]
    body = (
        "<h3>Data</h3>"
        + _table(facts)
        + (
            "<h4>Mixture</h4>" + _table(mixture, ("group", "target share", "share of train tokens", "train tokens", "val tokens"))
            if mixture
            else ""
        )
        + "<h4>Views</h4>"
        + _table(views, ("view", "split", "rows", "tokens in", "tokens packed", "dropped", "padded", "remainder"))
        + "<details><summary>stats.json</summary><pre>"
        + html.escape(json.dumps(stats, indent=1))
        + "</pre></details>"
    )
    return _page("data statistics", body)


def plan_page(plan: dict) -> str:
    warn = "".join(f"<li class='warn'>{html.escape(w)}</li>" for w in plan["warnings"])
    body = (
        f"<h3>Plan for run {html.escape(plan['run'])}</h3>"
        + _table(summary_rows(plan))
        + _table(hardware_rows(plan), HARDWARE_HEADER)
        + (f"<h4>Warnings</h4><ul>{warn}</ul>" if warn else "")
        + "<h4>Assumptions</h4><ul>"
        + "".join(f"<li>{html.escape(a)}</li>" for a in plan["assumptions"])
        + "</ul>"
    )
    return _page("plan", body)


def training_row(recs: list[dict]) -> str:
    """Steps, tokens, epochs and the final train loss (the last finite one; a skipped step logs none)."""
    if not recs:
        return "not recorded (no metrics.jsonl from this backend)"
    last = recs[-1]
    loss = next((r["loss"] for r in reversed(recs) if isinstance(r.get("loss"), (int, float))), None)
    parts = [f"{last['step']:,} steps"]
    parts += [f"{last['tokens']:,} tokens"] if last.get("tokens") is not None else []
    parts += [f"{last['epoch']:.3g} epochs"] if last.get("epoch") is not None else []
    return ", ".join(parts + [f"final train loss {loss:.4f}" if loss is not None else "no finite train loss"])


def _scored(ev: dict) -> str:
    """The rows evaluate scored, and the split's when eval.final_max_batches left some out."""
    n, of = ev["sequences"], ev.get("split_sequences", ev["sequences"])
    return f"{n:,}" if n == of else f"{n:,} of the split's {of:,}"


def eval_page(ev: dict, recs: list[dict]) -> str:
    rows = [
        ("val loss", f"{ev['val_loss']:.4f}"),
        ("perplexity", f"{ev['perplexity']:.2f}" if ev.get("perplexity") is not None else "beyond a double (loss > 709)"),
        ("predicted tokens", f"{ev['tokens']:,}"),
        ("sequences", _scored(ev)),
        ("model", ev["model"]),
        ("data", ev["data"]),
        ("training", training_row(recs)),
    ]
    return _page("evaluation", "<h3>Evaluation</h3>" + _table(rows))


def build(metrics, stats, plan, eval_json, out_dir) -> None:
    out = Path(out_dir)
    recs = read_metrics(metrics)
    plan_d = json.loads(Path(plan).read_text())
    if recs:
        plot(recs, out / "loss.png", out / "lr.png", f"(run {plan_d['run']})")
        _save(throughput_figure(recs, f"(run {plan_d['run']})"), out / "throughput.png")
    else:
        why = f"not recorded: no records in {metrics}"
        for name in ("loss.png", "lr.png", "throughput.png"):
            _nothing(out / name, why)
    _write(out / "data.html", data_page(json.loads(Path(stats).read_text())))
    _write(out / "plan.html", plan_page(plan_d))
    _write(out / "eval.html", eval_page(json.loads(Path(eval_json).read_text()), recs))
    log.info("report items -> %s", out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--metrics", required=True, help="train/metrics.jsonl")
    p.add_argument("--stats", required=True, help="data/stats.json")
    p.add_argument("--plan", required=True, help="plan.json")
    p.add_argument("--eval", required=True, help="eval.json")
    p.add_argument("--out", required=True, help="folder for loss.png, lr.png, throughput.png, data.html, plan.html, eval.html")
    args = p.parse_args(argv)
    build(args.metrics, args.stats, args.plan, args.eval, args.out)
