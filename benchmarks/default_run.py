"""Wall time of the embedded default run (all stages, fresh results/), against the 180 s target.

  python benchmarks/default_run.py [--repeat N] [--compare-masking]

Copies the repository to a temp folder, runs `snakemake --profile profiles/local` there, prints the
wall time, per-rule times from Snakemake's log and the ratio to the 3-minute budget on 2 cores.
--compare-masking: runs with train.document_masking false (the baseline: attention across documents, as
before) and with the default (auto: on), taking turns, and prints the ratio of wall and train_torch times.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 180.0


def one_run(overlay: str | None = None) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "repo"
        skip = shutil.ignore_patterns("results", ".snakemake", ".git", ".venvs", "__pycache__")
        shutil.copytree(REPO, work, ignore=skip)
        extra = []
        if overlay:
            (work / "overlay.yaml").write_text(overlay)
            extra = ["--configfile", "overlay.yaml"]
        start = time.perf_counter()
        proc = subprocess.run(["snakemake", "--profile", "profiles/local", *extra], cwd=work, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode:
            raise SystemExit(proc.stdout[-3000:] + proc.stderr[-3000:])
        return wall, rule_times(proc.stdout + proc.stderr)


def rule_times(log: str) -> dict:
    """Seconds per rule from the '[timestamp] ... rule X:' / 'Finished jobid: N (Rule: X)' lines."""
    stamp, starts, times = None, {}, {}
    for line in log.splitlines():
        if m := re.match(r"^\[(\w{3} \w{3} +\d+ [\d:]+ \d{4})\]$", line.strip()):
            stamp = datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
        elif m := re.match(r"^(?:local)?rule (\w+):", line.strip()):
            starts.setdefault(m.group(1), []).append(stamp)
        elif m := re.search(r"Finished jobid: \d+ \(Rule: (\w+)\)", line):
            begun = starts.get(m.group(1), [stamp]).pop(0)
            times[m.group(1)] = times.get(m.group(1), 0.0) + (stamp - begun).total_seconds()
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--compare-masking", action="store_true")
    args = p.parse_args()
    if args.compare_masking:
        return compare_masking(args.repeat)
    walls = []
    for i in range(args.repeat):
        wall, times = one_run()
        walls.append(wall)
        print(f"run {i + 1}: {wall:.1f} s  (" + ", ".join(f"{k} {v:.0f}s" for k, v in times.items() if k != "all") + ")")
    med = statistics.median(walls)
    print(f"default run, median of {len(walls)}: {med:.1f} s; target {TARGET_S:.0f} s; ratio {med / TARGET_S:.2f}")


def compare_masking(repeat: int) -> None:
    runs = {"off": [], "on": []}
    for i in range(repeat):
        for name, overlay in (("off", "train: {document_masking: false}\n"), ("on", None)):
            wall, times = one_run(overlay)
            runs[name].append((wall, times.get("train_torch", float("nan"))))
            print(f"run {i + 1}, document masking {name}: {wall:.1f} s, train_torch {runs[name][-1][1]:.0f} s", flush=True)
    off, on = ([statistics.median(x[k] for x in runs[n]) for k in (0, 1)] for n in ("off", "on"))
    print(
        f"medians of {repeat}: masking off {off[0]:.1f} s (train_torch {off[1]:.0f} s), on {on[0]:.1f} s "
        f"(train_torch {on[1]:.0f} s); on / off: wall {on[0] / off[0]:.3f}, train_torch {on[1] / off[1]:.3f} (limit 1.10)"
    )


if __name__ == "__main__":
    main()
