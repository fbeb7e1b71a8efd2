"""Peak memory and time of `llmpipe verify` on the shipped corpus (1x) and on 10 copies of it (10x).

  python benchmarks/verify_memory.py [--copies 10] [--baseline OLD_VERIFY.py] [--keep DIR]

For each size: the data stages through the CLI commands the Snakemake rules run (get-data, a copy of
the GPT-2 tokenizer, tokenize on 2 shards at once, token-store, pack hf / litgpt / megatron; train
remainder --remainder (carry), val pad, seq_len 256), then `python -m llmpipe verify` in a fresh process: its peak
RSS is that process's own ru_maxrss (os.wait4), with the time it took. 10x: the sample as 10 sources
(copies), so the store, every view and the rows to check are 10x. Also the floor: a process that
only imports what verify imports. Prints each run, and the 10x / 1x ratios (time should be ~10x,
peak RSS ~1x). --baseline: also run another verify.py (e.g. `git show HEAD~1:src/llmpipe/data/verify.py`)
the same way, for comparison (with --remainder drop: the old verify fails every carry litgpt view).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from peak import run_alone  # benchmarks/peak.py

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "data" / "gutenberg-sample-2mb.jsonl.gz"
GPT2 = REPO / "data" / "tokenizers" / "gpt2"
PY = [sys.executable, "-m", "llmpipe"]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src"), "TOKENIZERS_PARALLELISM": "false"}


def run(*args: str) -> None:
    p = subprocess.run(PY + list(args), capture_output=True, text=True, env=ENV)
    if p.returncode:
        raise SystemExit(f"{args[0]} failed:\n{p.stderr[-3000:]}")


def together(*commands: list[str]) -> None:
    jobs = [subprocess.Popen(PY + c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV) for c in commands]
    for j, c in zip(jobs, commands):
        err = j.communicate()[1]
        if j.returncode:
            raise SystemExit(f"{c[0]} failed:\n{err[-3000:]}")


def build(work: Path, copies: int, remainder: str) -> dict:
    """Sources, tokenizer, store and the three views of `copies` copies of the sample."""
    work.mkdir(parents=True)
    sources = []
    for i in range(copies):
        sources.append(str(work / f"corpus-{i:02d}.jsonl.gz"))
        shutil.copyfile(CORPUS, sources[-1])
    cfg = json.dumps(
        {
            "run": "bench",
            "data": {"sources": sources, "num_shards": 2, "remainder": remainder, "val_remainder": "pad"},
            "tokenizer": {"source": str(GPT2)},
            "train": {"seq_len": 256},
        }
    )
    t0 = time.perf_counter()
    together(
        ["get-data", "--config", cfg, "--out", str(work / "sources.json")],
        ["tokenizer", "--config", cfg, "--out", str(work / "tok")],
    )
    store = work / "tokens"
    shards = [str(store / f"shard-{i:05d}.safetensors") for i in range(2)]
    common = ["--config", cfg, "--sources", str(work / "sources.json"), "--tokenizer", str(work / "tok")]
    together(*(["tokenize", *common, "--shard", str(i), "--out", s] for i, s in enumerate(shards)))
    run("token-store", "--shards", *shards, "--sources", str(work / "sources.json"), "--out", str(store / "manifest.json"))
    views = [work / "views" / f for f in ("hf", "litgpt", "megatron")]
    for v in views:
        run(
            "pack",
            "--config",
            cfg,
            "--store",
            str(store / "manifest.json"),
            "--format",
            v.name,
            "--tokenizer",
            str(work / "tok"),
            "--out",
            str(v),
        )
    manifest = json.loads((store / "manifest.json").read_text())
    return {
        "cfg": cfg,
        "work": work,
        "views": views,
        "tokens": sum(manifest["totals"][s]["tokens"] for s in ("train", "val")),
        "bytes": sum(f.stat().st_size for v in [store, *views] for f in v.rglob("*") if f.is_file()),
        "build_s": round(time.perf_counter() - t0, 1),
    }


def measure(code: str, args: list[str]) -> dict:
    """Run `python -c code args...` alone; its wall time and peak RSS (ru_maxrss of that process)."""
    wall, peak, _ = run_alone([sys.executable, "-c", code, *args], env=ENV)
    return {"s": round(wall, 2), "peak_rss_mb": round(peak / 2**20, 1)}


def verify_code(module: Path | None) -> str:
    if module is None:
        return "import sys; from llmpipe.data.verify import main; main(sys.argv[1:])"
    return (
        "import importlib.util, sys; "
        f"spec = importlib.util.spec_from_file_location('llmpipe.data.verify', {str(module)!r}); "
        "m = importlib.util.module_from_spec(spec); sys.modules[spec.name] = m; spec.loader.exec_module(m); m.main(sys.argv[1:])"
    )


def verify_args(b: dict) -> list[str]:
    w = b["work"]
    return [
        "--config",
        b["cfg"],
        "--store",
        str(w / "tokens" / "manifest.json"),
        "--views",
        *map(str, b["views"]),
        "--tokenizer",
        str(w / "tok"),
        "--sources",
        str(w / "sources.json"),
        "--out",
        str(w / "stats.json"),
    ]


FLOOR = (
    "import numpy, pyarrow, tokenizers, safetensors; import llmpipe.data.verify, llmpipe.data.views.hf, llmpipe.data.tokenizer"
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--copies", type=int, default=10)
    p.add_argument("--remainder", default="carry", choices=["drop", "pad", "carry"], help="train rows' remainder policy")
    p.add_argument("--baseline", type=Path, help="another verify.py to measure the same way")
    p.add_argument("--keep", type=Path, help="build under this folder and leave it")
    args = p.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="verify_mem_"))
    try:
        sizes = {}
        for label, copies in (("1x", 1), (f"{args.copies}x", args.copies)):
            b = build(root / label, copies, args.remainder)
            res = {"tokens": b["tokens"], "store_and_views_mb": round(b["bytes"] / 2**20, 1), "build_s": b["build_s"]}
            res["verify"] = measure(verify_code(None), verify_args(b))
            stats = json.loads((b["work"] / "stats.json").read_text())
            res["checked"] = {
                f: {s: v["conservation"][s]["tokens_checked"] for s in ("train", "val")} for f, v in stats["views"].items()
            }
            if args.baseline:
                res["baseline"] = measure(verify_code(args.baseline.resolve()), verify_args(b))
            sizes[label] = res
            print(label, json.dumps(res), flush=True)
        floor = measure(FLOOR, [])
        print("floor (imports only):", json.dumps(floor))
        a, b = sizes.values()
        for k in ("verify", "baseline"):
            if k in a:
                print(
                    f"{k}: time {a[k]['s']} s -> {b[k]['s']} s (x{b[k]['s'] / a[k]['s']:.2f}); "
                    f"peak RSS {a[k]['peak_rss_mb']} MB -> {b[k]['peak_rss_mb']} MB (x{b[k]['peak_rss_mb'] / a[k]['peak_rss_mb']:.3f}); "
                    f"above the floor {a[k]['peak_rss_mb'] - floor['peak_rss_mb']:.1f} -> {b[k]['peak_rss_mb'] - floor['peak_rss_mb']:.1f} MB"
                )
        print(f"data: {a['store_and_views_mb']} MB -> {b['store_and_views_mb']} MB, tokens {a['tokens']} -> {b['tokens']}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
