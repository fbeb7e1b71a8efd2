"""Wall time and peak RSS of a dry run (`snakemake -n`) with many token-store shards.

  python benchmarks/dry_run_shards.py [--shards 1000 10000 50000] [--repeat 3] [--profile profiles/local]

Copies the repository to a temp folder and times `snakemake -n --profile P --configfile overlay.yaml`
(the whole process: Python start, parsing, config validation, the DAG) with data.num_shards set, the
tokenize jobs grouped into at most 64 (data.shards_per_job set as null sets it for as many sources as
shards; the embedded config's one source would make a single job of them all). The baseline, measured in the
same run, is one shard a job (shards_per_job: 1, how every shard was its own job before) at 10,000
shards. Target: 10,000 shards in under 15 s and 2 GB.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from peak import run_alone  # benchmarks/peak.py

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from llmpipe.data.tokenize import MAX_AUTO_JOBS, num_jobs  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TARGET_S, TARGET_GB = 15.0, 2.0
SKIP = shutil.ignore_patterns("results", ".snakemake", ".git", ".venvs", "__pycache__", "*.egg-info", ".pytest_cache")


def dry_run(work: Path, profile: str, shards: int, per_job: int | None) -> tuple[float, float, int]:
    """(seconds, peak RSS in GB, tokenize jobs listed) of one dry run."""
    overlay = work / "shards.yaml"
    overlay.write_text(f"data: {{num_shards: {shards}, shards_per_job: {'null' if per_job is None else per_job}}}\n")
    cmd = [sys.executable, "-m", "snakemake", "-n", "--profile", profile, "--configfile", str(overlay)]
    wall, peak, text = run_alone(cmd, cwd=work)
    expected = num_jobs({"num_shards": shards, "shards_per_job": per_job})
    jobs = text.count("rule tokenize:")
    if jobs != expected:
        raise SystemExit(f"expected {expected} tokenize jobs in the dry run, saw {jobs}")
    return wall, peak / 2**30, jobs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=int, nargs="+", default=[1000, 10000, 50000])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--profile", default="profiles/local")
    p.add_argument("--no-baseline", action="store_true", help="skip the one-shard-a-job run at 10,000 shards")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "repo"
        shutil.copytree(REPO, work, ignore=SKIP)
        rows = []
        for shards in args.shards:
            grouped = -(-shards // MAX_AUTO_JOBS)
            runs = [dry_run(work, args.profile, shards, grouped) for _ in range(args.repeat)]
            rows.append((shards, statistics.median(r[0] for r in runs), max(r[1] for r in runs), runs[0][2]))
            print(
                f"{shards:>7,} shards: {rows[-1][1]:.2f} s, peak RSS {rows[-1][2]:.2f} GB, {rows[-1][3]} tokenize jobs",
                flush=True,
            )
        if not args.no_baseline:
            wall, rss, jobs = dry_run(work, args.profile, 10000, 1)
            print(f"baseline, 10,000 shards one a job: {wall:.2f} s, peak RSS {rss:.2f} GB, {jobs} tokenize jobs")
            ours = [r for r in rows if r[0] == 10000]
            if ours:
                print(f"grouped / one-a-job at 10,000 shards: time {ours[0][1] / wall:.2f}x, RSS {ours[0][2] / rss:.2f}x")
    for shards, wall, rss, _ in rows:
        print(
            f"{shards:,} shards vs target ({TARGET_S:.0f} s, {TARGET_GB:.0f} GB): time {wall / TARGET_S:.2f}, RSS {rss / TARGET_GB:.2f}"
        )


if __name__ == "__main__":
    main()
