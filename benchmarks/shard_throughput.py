"""Local profile, real run of the tokenize stage with many shards: is per-job overhead dominating?

  python benchmarks/shard_throughput.py [--shards 200 4096] [--baseline-shards 200]

For each shard count, in a temp copy of the repository: get_data and the tokenizer (GPT-2, copied) run
first, untimed; then `snakemake --profile local <run>/data/tokens/manifest.json` is timed: the tokenize
jobs (at most 64: data.shards_per_job set as null sets it for as many sources as shards; the sample's one
source would make a single job) and the store. Printed: wall, tokenize jobs, jobs/s,
shards/s. Baseline measured in the same run: one shard a job (shards_per_job: 1, how every shard was its
own job before) at --baseline-shards. Corpus: the shipped 2 MB sample (the work per shard is tiny, so
this measures overhead).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
from llmpipe.data.tokenize import MAX_AUTO_JOBS  # noqa: E402

SKIP = shutil.ignore_patterns("results", ".snakemake", ".git", ".venvs", "__pycache__", "*.egg-info", ".pytest_cache")


def snakemake(work: Path, target: str, overlay: Path) -> None:
    cmd = [sys.executable, "-m", "snakemake", "--profile", "profiles/local", target, "--configfile", str(overlay)]
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stdout[-3000:] + proc.stderr[-3000:])


def measure(work: Path, shards: int, per_job: int | None) -> dict:
    run = f"s{shards}-{per_job or 'auto'}"
    overlay = work / f"{run}.yaml"
    data = {"num_shards": shards, "shards_per_job": per_job}
    overlay.write_text(json.dumps({"run": run, "data": data, "tokenizer": {"source": "data/tokenizers/gpt2"}}))
    snakemake(work, f"results/{run}/tokenizer", overlay)  # and get_data: not timed
    start = time.perf_counter()
    snakemake(work, f"results/{run}/data/tokens/manifest.json", overlay)
    wall = time.perf_counter() - start
    jobs = len(list((work / "results" / run / "data" / "tokens").glob("job-*")))
    made = len(list((work / "results" / run / "data" / "tokens").rglob("shard-*.safetensors")))
    assert made == shards, (made, shards)
    return {"shards": shards, "jobs": jobs, "wall": wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=int, nargs="+", default=[200, 4096])
    p.add_argument("--baseline-shards", type=int, default=200, help="0: no baseline")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "repo"
        shutil.copytree(REPO, work, ignore=SKIP)
        rows = [("grouped", measure(work, n, -(-n // MAX_AUTO_JOBS))) for n in args.shards]
        if args.baseline_shards:
            rows.append(("one shard a job (baseline)", measure(work, args.baseline_shards, 1)))
    for label, r in rows:
        print(
            f"{label:>27}: {r['shards']:>5} shards in {r['jobs']:>4} jobs: {r['wall']:6.1f} s, "
            f"{r['jobs'] / r['wall']:.2f} jobs/s, {r['shards'] / r['wall']:.1f} shards/s"
        )
    base = [r for label, r in rows if label.startswith("one")]
    same = [r for label, r in rows if label == "grouped" and base and r["shards"] == base[0]["shards"]]
    if same:
        print(f"grouped / one-a-job at {base[0]['shards']} shards: {same[0]['wall'] / base[0]['wall']:.2f}x the time")


if __name__ == "__main__":
    main()
