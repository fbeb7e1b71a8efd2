"""One gzip source into 2 and 16 shards: time to the token store and the bytes read (one read per byte?).

  python benchmarks/shard_reads.py [--source ../shared/data/corpus/gutenberg-chunks-100mb.jsonl.gz] [--shards 2 16]
                                   [--repeat 3] [--no-baseline]

For each shard count, in a temporary copy of the repository: get-data and the tokenizer (GPT-2, copied) run
first, untimed; then `snakemake --profile local --cores 2 <run>/data/tokens/manifest.json` is timed (the
tokenize jobs and the store). Baseline in the same run: the largest shard count with data.shards_per_job 1
(one job per shard, each reading the whole source: how tokenize read before). Each of --repeat rounds runs
every variant once, in reverse order every other round (A B C, C B A: a drift in the machine's speed hits
both sides of a ratio alike), each into a fresh run folder. Printed per variant: the median wall, tokenize
jobs, the store's source_reads (bytes read / source size), and its wall over the first shard count's in
the same round (median and every round's).
Target (H3): 16 shards within 1.15x the time of 2 shards, bytes read = the source size (ratio 1.0).
--one-job adds each shard count in one job (data.shards_per_job = shards): for a plain JSONL file cut into
byte ranges, whose default is a job a shard, that job's 2 processes each write whole shards, reading their
ranges (shard_pool), as a cluster profile's jobs of a shard per thread do.
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


def measure(work: Path, source: Path, shards: int, per_job: int | None, round_: int) -> dict:
    run = f"r{shards}-{per_job or 'auto'}-{round_}"
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
    shutil.rmtree(work / "results" / run)  # ~55 MB a run
    return {"shards": shards, "jobs": jobs, "wall": wall, "reads": manifest.get("source_reads"), "fp": manifest["fingerprint"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", type=Path, default=CHUNKS)
    p.add_argument("--shards", type=int, nargs="+", default=[2, 16])
    p.add_argument("--repeat", type=int, default=3, help="rounds (each variant once a round)")
    p.add_argument("--no-baseline", action="store_true")
    p.add_argument("--one-job", action="store_true", help="also all shards in one job (a file cut into byte ranges)")
    args = p.parse_args()
    variants = [("one read per job (default)", n, None) for n in args.shards]
    if args.one_job:  # a cut file's default is a job a shard; this is a job of them all (its processes read apart)
        variants += [("one job, 2 processes", n, n) for n in args.shards]
    if not args.no_baseline:
        variants.append(("baseline: one job per shard", max(args.shards), 1))
    runs: list[list[dict]] = [[] for _ in variants]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "repo"
        shutil.copytree(REPO, work, ignore=SKIP)
        for r in range(args.repeat):
            for i in list(range(len(variants)))[:: -1 if r % 2 else 1]:
                _, shards, per_job = variants[i]
                runs[i].append(measure(work, args.source.resolve(), shards, per_job, r))
    print(f"source: {args.source} ({args.source.stat().st_size / 1e6:.1f} MB), 2 cores, local profile, {args.repeat} rounds")
    for (name, shards, _), rs in zip(variants, runs):
        ratios = sorted(x["wall"] / first["wall"] for x, first in zip(rs, runs[0]))
        walls = sorted(x["wall"] for x in rs)
        reads = {json.dumps(x["reads"], sort_keys=True) for x in rs}
        shown = (json.loads(reads.pop()) or {}).get("ratio") if len(reads) == 1 else f"differs between rounds: {sorted(reads)}"
        print(
            f"{name:<30} {shards:>5} shards {rs[0]['jobs']:>3} jobs {walls[len(walls) // 2]:7.2f} s  "
            f"x{ratios[len(ratios) // 2]:.2f} of {args.shards[0]} shards (rounds: {', '.join(f'{x:.2f}' for x in ratios)})   "
            f"bytes read / source: {shown}"
        )
    big = [x["fp"] for (_, shards, _), rs in zip(variants, runs) if shards == max(args.shards) for x in rs]
    print(f"the {max(args.shards)}-shard stores are identical across groupings and rounds: {len(set(big)) == 1}")


if __name__ == "__main__":
    main()
