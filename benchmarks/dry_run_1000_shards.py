"""Wall time of a dry run (`snakemake -n`) of the DAG with 1,000 tokenize shards, against the 5 s target.

  python benchmarks/dry_run_1000_shards.py [--shards 1000] [--repeat 3] [--profile profiles/local]

Copies the repository to a temp folder, adds a config overlay with data.num_shards, times
`snakemake -n --profile P --configfile overlay.yaml` (whole process: Python start, parsing, config
validation, DAG of ~1,010 jobs) and prints the median and its ratio to the target.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 5.0
SKIP = shutil.ignore_patterns("results", ".snakemake", ".git", "__pycache__", "*.egg-info", ".pytest_cache")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--profile", default="profiles/local")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "repo"
        shutil.copytree(REPO, work, ignore=SKIP)
        (work / "shards.yaml").write_text(f"data: {{num_shards: {args.shards}}}\n")
        cmd = [sys.executable, "-m", "snakemake", "-n", "--profile", args.profile, "--configfile", "shards.yaml"]
        walls = []
        for i in range(args.repeat):
            start = time.perf_counter()
            proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
            walls.append(time.perf_counter() - start)
            if proc.returncode:
                raise SystemExit(proc.stdout[-3000:] + proc.stderr[-3000:])
            jobs = proc.stdout.count("rule tokenize:")
            if jobs != args.shards:
                raise SystemExit(f"expected {args.shards} tokenize jobs in the dry run, saw {jobs}")
            print(f"run {i + 1}: {walls[-1]:.2f} s ({jobs} tokenize jobs)")
    med = statistics.median(walls)
    print(
        f"dry run with {args.shards} shards, median of {len(walls)}: {med:.2f} s; target {TARGET_S:.0f} s; "
        f"ratio {med / TARGET_S:.2f}"
    )


if __name__ == "__main__":
    main()
