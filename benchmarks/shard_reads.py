"""One gzip source into 2 and 16 shards: time to the token store and the bytes read (one read per byte?).

  python benchmarks/shard_reads.py [--source ../shared/data/corpus/gutenberg-chunks-100mb.jsonl.gz] [--shards 2 16]

For each shard count, in a temporary copy of the repository: get-data and the tokenizer (GPT-2, copied) run
first, untimed; then `snakemake --profile local --cores 2 <run>/data/tokens/manifest.json` is timed (the
tokenize jobs and the store). Printed per run: wall, tokenize jobs, the store's source_reads (bytes read /
source size), and each run's wall over the first one's. Baseline in the same run: the largest shard count
with data.shards_per_job 1 (one job per shard, each reading the whole source: how tokenize read before).
Target (H3): 16 shards within 1.15x the time of 2 shards, bytes read = the source size (ratio 1.0).
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
SKIP = shutil.ignore_patterns("results", ".snakemake", ".git", ".venvs", "__pycache__", "*.egg-info", ".pytest_cache")
CHUNKS = REPO.parent / "shared" / "data" / "corpus" / "gutenberg-chunks-100mb.jsonl.gz"


def snakemake(work: Path, target: str, overlay: Path) -> None:
    cmd = [sys.executable, "-m", "snakemake", "--profile", "profiles/local", "--cores", "2", target, "--configfile", str(overlay)]
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stdout[-3000:] + proc.stderr[-3000:])


def measure(work: Path, source: Path, shards: int, per_job: int | None) -> dict:
    run = f"r{shards}-{per_job or 'auto'}"
    overlay = work / f"{run}.yaml"
    data = {"sources": [str(source)], "num_shards": shards, "shards_per_job": per_job}
    overlay.write_text(json.dumps({"run": run, "data": data, "tokenizer": {"source": "data/tokenizers/gpt2"}}))
    snakemake(work, f"results/{run}/tokenizer", overlay)  # and get-data: not timed
    start = time.perf_counter()
    snakemake(work, f"results/{run}/data/tokens/manifest.json", overlay)
    wall = time.perf_counter() - start
    store = work / "results" / run / "data" / "tokens"
    manifest = json.loads((store / "manifest.json").read_text())
    jobs = len(list(store.glob("job-*")))
    return {"shards": shards, "jobs": jobs, "wall": wall, "reads": manifest.get("source_reads"), "fp": manifest["fingerprint"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", type=Path, default=CHUNKS)
    p.add_argument("--shards", type=int, nargs="+", default=[2, 16])
    p.add_argument("--no-baseline", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "repo"
        shutil.copytree(REPO, work, ignore=SKIP)
        rows = [("one read per job (default)", measure(work, args.source.resolve(), n, None)) for n in args.shards]
        if not args.no_baseline:
            rows.append(("baseline: one job per shard", measure(work, args.source.resolve(), max(args.shards), 1)))
    first = rows[0][1]["wall"]
    print(f"source: {args.source} ({args.source.stat().st_size / 1e6:.1f} MB), 2 cores, local profile")
    for name, r in rows:
        reads = r["reads"] or {}
        print(
            f"{name:<30} {r['shards']:>5} shards {r['jobs']:>3} jobs {r['wall']:7.2f} s  "
            f"x{r['wall'] / first:.2f} of {args.shards[0]} shards   bytes read / source: {reads.get('ratio')}"
        )
    same = len({r["fp"] for _, r in rows if r["shards"] == max(args.shards)}) == 1
    print(f"the {max(args.shards)}-shard stores are identical across groupings: {same}")


if __name__ == "__main__":
    main()
