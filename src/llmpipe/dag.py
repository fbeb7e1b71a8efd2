"""dag: the planning picture of a profile's workflow, offline, before anything runs.

  llmpipe dag [--profile slurm-trn1] [--out dag/] [-- other snakemake arguments, e.g. --config preset=llama-3-70b-trn1]

One box per rule (the rule graph), each with what its jobs ask the cluster for (job count, nodes, GPUs /
NeuronCores / TPU or SageMaker instances, CPUs, memory, time limit; "submit host" for local rules); the
training rule also shows the plan's estimated wall time and cost on the planned hardware. Written as
planning-dag.svg and .png (Graphviz's dot when installed, else drawn with matplotlib), planning-dag.dot
and planning-dag.md (a mermaid graph, each box labelled as above). Snakemake itself is asked (`--rulegraph`, `-n -F`),
so the picture is what that profile would submit.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from llmpipe.io import atomic_path
from llmpipe.profiles import gres_gpus

TRAINING = re.compile(r"^(train_\w+|neuron_precompile)$")


def snakemake(args: list[str], env: dict | None = None, cwd: Path | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=1800
    )
    if proc.returncode:
        raise SystemExit(f"llmpipe dag: snakemake {' '.join(args)} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return proc.stdout


def parse_rulegraph(dot: str) -> tuple[list[str], list[tuple[str, str]]]:
    """Rule names and (upstream, downstream) edges of `snakemake --rulegraph` (DOT)."""
    names = dict(re.findall(r'^\s*(\d+)\[label = "(\w+)"', dot, re.M))
    edges = [(names[a], names[b]) for a, b in re.findall(r"^\s*(\d+) -> (\d+)", dot, re.M)]
    return list(names.values()), edges


def dry_run_jobs(out: str) -> list[tuple[str, dict, int]]:
    """(rule, resources, threads) of every job `snakemake -n` lists."""
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", out):
        m = re.match(r"(?:local)?rule (\w+):", block)
        if not m:
            continue
        res = re.search(r"\n\s+resources: (.*)", block)
        threads = re.search(r"\n\s+threads: (\d+)", block)
        resources = dict(kv.split("=", 1) for kv in res.group(1).split(", ")) if res else {}
        jobs.append((m.group(1), resources, int(threads.group(1)) if threads else 1))
    return jobs


def parse_dry_run(out: str) -> dict[str, dict]:
    """Per rule: job count, resources and threads of its first job."""
    rules: dict[str, dict] = {}
    for rule, resources, threads in dry_run_jobs(out):
        entry = rules.setdefault(rule, {"jobs": 0, "resources": resources, "threads": threads})
        entry["jobs"] += 1
    return rules


def _hours(minutes: str) -> str:
    m = float(minutes)
    return f"{m:g} min" if m < 120 else f"{m / 60:g} h"


def asks(rule: str, info: dict, job: dict, plan: dict | None) -> list[str]:
    """Lines saying what this rule's jobs ask for."""
    cfg, res = info["config"], job["resources"]
    if rule == "all":
        return ["the target (runs nothing)"]
    if rule in info["local_rules"]:
        return [f"{job['jobs']} job(s) on the submit host"]
    nodes = int(res.get("nodes", 1))
    lines = [f"{job['jobs']} job(s)" + (f" x {nodes} nodes" if nodes > 1 else "")]
    devices = []
    gres = gres_gpus(res.get("gres"))
    if gres:
        devices.append(f"{gres} GPUs/node")
    if res.get("gpu") not in (None, "0"):
        devices.append(f"{res['gpu']} GPUs")
    if info["backend"] == "neuron" and TRAINING.match(rule):
        devices.append(f"{cfg['parallel']['nproc_per_node']} NeuronCores/node")
    if info["backend"] == "sagemaker" and rule == "train_sagemaker":
        s = cfg["sagemaker"]
        devices.append(f"SageMaker {cfg['parallel']['nnodes']} x {s['instance_type']}")
    if info["backend"] == "levanter" and rule == "train_levanter":
        devices.append(f"JAX on {cfg['levanter']['jax_platforms'] or 'the default platform'}")
    cpus = res.get("cpus_per_task") or str(job["threads"])
    mem = f"{int(res['mem_mb']) / 1000:g} GB" if "mem_mb" in res else "?"
    time = _hours(res["runtime"]) if "runtime" in res else "no limit"
    lines.append(
        ", ".join(devices + [f"{cpus} CPUs", mem, time] + (["exclusive"] if "exclusive" in res.get("slurm_extra", "") else []))
    )
    if plan and rule == f"train_{info['backend']}":
        lines += plan_lines(plan)
    return lines


def plan_lines(plan: dict) -> list[str]:
    from llmpipe.plan.render import _duration

    s = plan["schedule"]
    out = [f"plan: {s['steps']:,} steps x {s['tokens_per_step']:,} tokens"]
    for row in plan["hardware"]:
        cost = f"${row['cost_usd']:,.0f}" if row["cost_usd"] >= 10 else f"${row['cost_usd']:.2f}"
        fits = {True: "", False: ", DOES NOT FIT", None: ", no layout"}[row["fits"]]
        out.append(f"{row['name']} x {row['instances']}: {_duration(row['hours'])}, {cost}{fits}")
    return out


def dot_source(rules: list[str], edges: list[tuple[str, str]], labels: dict[str, list[str]]) -> str:
    def esc(text: str) -> str:
        return text.replace("\\", "\\\\").replace('"', '\\"')

    lines = [
        "digraph planning {",
        "  rankdir=TB;",
        '  node [shape=box, style="rounded", fontname="Helvetica", fontsize=10];',
        "  edge [color=grey40];",
    ]
    for r in rules:
        body = "\\n".join(esc(x) for x in [r, *labels.get(r, [])])
        bold = ", penwidth=2.5, color=firebrick" if TRAINING.match(r) else ""
        lines.append(f'  "{r}" [label="{body}"{bold}];')
    lines += [f'  "{a}" -> "{b}";' for a, b in edges]
    return "\n".join(lines + ["}"]) + "\n"


def mermaid(rules: list[str], edges: list[tuple[str, str]], labels: dict[str, list[str]]) -> str:
    def text(r: str) -> str:
        return "<br/>".join([r, *labels.get(r, [])]).replace('"', "'")

    lines = ["flowchart TB"] + [f'  {r}["{text(r)}"]' for r in rules] + [f"  {a} --> {b}" for a, b in edges]
    return "\n".join(lines) + "\n"


def layers(rules: list[str], edges: list[tuple[str, str]]) -> dict[str, int]:
    """Longest-path depth of each rule from the sources (rule graphs are acyclic)."""
    depth = {r: 0 for r in rules}
    for _ in rules:
        for a, b in edges:
            depth[b] = max(depth[b], depth[a] + 1)
    return depth


def draw(rules: list[str], edges: list[tuple[str, str]], labels: dict[str, list[str]], out: Path) -> None:
    """The picture without Graphviz: layered boxes and arrows with matplotlib (SVG and PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"  # text stays text in the SVG (searchable, selectable)
    depth = layers(rules, edges)
    rows: dict[int, list[str]] = {}
    for r in rules:
        rows.setdefault(depth[r], []).append(r)
    width = max(len(v) for v in rows.values())
    box_w, box_h = 3.8, 1.5
    fig, ax = plt.subplots(figsize=(max(8, width * (box_w + 0.6)), max(4, len(rows) * (box_h + 0.7))))
    pos = {}
    for d, names in rows.items():
        for i, r in enumerate(sorted(names)):
            pos[r] = ((i - (len(names) - 1) / 2) * (box_w + 0.6), -d * (box_h + 0.7))
    for a, b in edges:
        (xa, ya), (xb, yb) = pos[a], pos[b]
        ax.annotate(
            "",
            xy=(xb, yb + box_h / 2),
            xytext=(xa, ya - box_h / 2),
            arrowprops={"arrowstyle": "->", "color": "grey", "lw": 1},
            zorder=1,
        )
    for r, (x, y) in pos.items():
        train = bool(TRAINING.match(r))
        ax.add_patch(
            plt.Rectangle(
                (x - box_w / 2, y - box_h / 2),
                box_w,
                box_h,
                fill=True,
                facecolor="white",
                edgecolor="firebrick" if train else "steelblue",
                lw=2 if train else 1,
                zorder=2,
            )
        )
        ax.text(x, y + box_h / 2 - 0.12, r, ha="center", va="top", fontsize=8, fontweight="bold", zorder=3)
        body = "\n".join(textwrap.fill(line, 44) for line in labels.get(r, []))
        ax.text(x, y + box_h / 2 - 0.38, body, ha="center", va="top", fontsize=5.5, zorder=3)
    xs = [x for x, _ in pos.values()]
    ys = [y for _, y in pos.values()]
    ax.set_xlim(min(xs) - box_w, max(xs) + box_w)
    ax.set_ylim(min(ys) - box_h, max(ys) + box_h)
    ax.axis("off")
    for suffix in ("svg", "png"):
        with atomic_path(out.with_suffix(f".{suffix}")) as tmp:
            fig.savefig(tmp, format=suffix, dpi=150, bbox_inches="tight")
    plt.close(fig)


def render(rules: list[str], edges: list[tuple[str, str]], labels: dict[str, list[str]], out: Path, use_dot: bool = True) -> str:
    """Write planning-dag.{dot,md,svg,png}; returns what drew the picture ("graphviz" or "matplotlib")."""
    source = dot_source(rules, edges, labels)
    for suffix, text in (("dot", source), ("md", "```mermaid\n" + mermaid(rules, edges, labels) + "```\n")):
        with atomic_path(out.with_suffix(f".{suffix}")) as tmp:
            tmp.write_text(text)
    dot = shutil.which("dot") if use_dot else None
    if dot:
        for suffix in ("svg", "png"):
            with atomic_path(out.with_suffix(f".{suffix}")) as tmp:
                subprocess.run([dot, f"-T{suffix}", "-o", str(tmp)], input=source, text=True, check=True)
        return "graphviz"
    draw(rules, edges, labels, out)
    return "matplotlib"


def cluster_profile(args: list[str]) -> bool:
    """Whether these snakemake arguments (--executor, else the last profile's) submit jobs to a cluster."""
    from llmpipe.profiles import named_executor

    return named_executor(args) not in (None, "local")


def planning_dag(profile: str | None, extra: list[str], out_dir: Path, use_dot: bool = True) -> dict:
    base = (["--profile", profile] if profile else []) + extra
    if cluster_profile(base) and not {"--cores", "-c"} & set(extra):
        base += ["--cores", "1024"]  # a cluster job's threads are not capped by this host's cores
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "LLMPIPE_DAG_INFO": str(Path(tmp) / "info.json")}
        dry = snakemake(["-n", "-F", *base], env=env)
        info = json.loads((Path(tmp) / "info.json").read_text())
    rules, edges = parse_rulegraph(snakemake(["--rulegraph", *base]))
    jobs = parse_dry_run(dry)
    plan, problem = None, None
    try:
        from llmpipe import config as cfgmod
        from llmpipe.plan.cli import build

        plan = build(cfgmod.validate(info["config"]), allow_unknown_data=True)
    except (ValueError, FileNotFoundError, OSError) as exc:  # the picture still shows the cluster requests
        problem = f"no plan: {exc}"
    labels = {r: asks(r, info, jobs[r], plan) for r in rules if r in jobs}
    if problem:
        labels.setdefault(f"train_{info['backend']}", []).append(problem)
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = render(rules, edges, labels, out_dir / "planning-dag", use_dot)
    return {
        "rules": rules,
        "edges": edges,
        "labels": labels,
        "plan": plan,
        "drawn_with": drawn,
        "backend": info["backend"],
        "profile": info["profile"],
    }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(prog="llmpipe dag", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", help="Snakemake profile: the name of a folder in profiles/, or a folder")
    p.add_argument("--out", default="dag", help="folder for planning-dag.{svg,png,dot,md} (default: dag)")
    p.add_argument("--no-graphviz", action="store_true", help="draw with matplotlib even where dot is installed")
    args = p.parse_args(argv[:split])
    if args.profile:
        from llmpipe.config import ConfigError
        from llmpipe.profiles import profile_dir

        try:
            profile_dir(args.profile)
        except ConfigError as exc:  # before Snakemake, whose message names only the user's profile folders
            raise SystemExit(f"llmpipe dag: {exc}") from None
    result = planning_dag(args.profile, argv[split + 1 :], Path(args.out), use_dot=not args.no_graphviz)
    out = Path(args.out) / "planning-dag"
    print(
        f"llmpipe dag: backend {result['backend']}, {len(result['rules'])} rules; wrote {out}.svg, {out}.png "
        f"(drawn with {result['drawn_with']}), {out}.dot, {out}.md"
    )
