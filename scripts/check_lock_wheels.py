"""Check, without installing, that requirements.lock installs with no compiler on every Python and
platform we promise (CPython 3.11-3.13, Linux x86_64 and aarch64): for each target, pip resolves the
lock's lines that apply there (markers evaluated for that target) to wheels only
(`pip install --dry-run --only-binary=:all: --python-version X --platform ... --target ...`).
pip itself is a pinned recent release run from its wheel (PIP): pip 23.2 checks Requires-Python
against the running interpreter, not --python-version. A package listed in PURE_SDISTS has no wheel on PyPI; it passes if it builds, here, into a
`py3-none-any` wheel (pure Python: nothing to compile on the user's machine).

Usage: python scripts/check_lock_wheels.py [--lock requirements.lock]   (needs PyPI; exit 1 on a gap)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.requirements import Requirement

PYTHONS = ["3.11", "3.12", "3.13"]
MACHINES = ["x86_64", "aarch64"]
GLIBC = range(35, 16, -1)  # manylinux_2_35 (Ubuntu 22.04, Debian 12 has 2.36) down to 2_17
PURE_SDISTS = {"connection-pool"}  # snakemake's dependency: a pure-Python sdist only
PIP = "pip==25.3"
INDEX = ["--isolated", "--index-url", "https://pypi.org/simple"]  # PyPI only: no local config, wheels or caps


def platforms(machine: str) -> list[str]:
    return [f"manylinux_2_{v}_{machine}" for v in GLIBC] + [f"manylinux2014_{machine}"]


def lock_requirements(lock: Path) -> list[Requirement]:
    lines = [ln.split("#")[0].strip() for ln in lock.read_text().splitlines()]
    return [Requirement(ln) for ln in lines if ln]


def applies(req: Requirement, python: str, machine: str) -> bool:
    if req.marker is None:
        return True
    env = {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "platform_machine": machine,
        "platform_system": "Linux",
        "sys_platform": "linux",
        "os_name": "posix",
        "extra": "",
    }
    return req.marker.evaluate(env)


def pip_command(tmp: Path) -> list[str]:
    """`python <pip wheel>/pip`: PIP downloaded once into tmp (a wheel runs as it is)."""
    got = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(tmp), PIP, *INDEX])
    if got.returncode:
        sys.exit(f"lock: cannot download {PIP} from PyPI")
    return [sys.executable, str(next(tmp.glob("pip-*.whl")) / "pip")]


def dry_run(pip: list[str], reqs: list[str], python: str, machine: str, tmp: Path) -> subprocess.CompletedProcess:
    listed = tmp / f"req-{python}-{machine}.txt"
    listed.write_text("\n".join(reqs) + "\n")
    cmd = [*pip, "install", "--dry-run", "--quiet", "--no-deps", "--only-binary=:all:", *INDEX]
    cmd += ["--python-version", python, "--implementation", "cp", "--target", str(tmp / f"target-{python}-{machine}")]
    for p in platforms(machine):
        cmd += ["--platform", p]
    return subprocess.run([*cmd, "-r", str(listed)], capture_output=True, text=True)


def pure_sdist_ok(pip: list[str], req: str, tmp: Path) -> str | None:
    """None when `req` builds into a py3-none-any wheel, else what went wrong."""
    out = tmp / "sdist-wheels"
    cmd = [*pip, "wheel", "--quiet", "--no-deps", "--no-binary=:all:", "-w", str(out), req, *INDEX]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        return f"{req}: the sdist does not build: {done.stderr.strip()[-400:]}"
    wheels = list(out.glob("*.whl"))
    if not wheels or not all(w.name.endswith("-none-any.whl") for w in wheels):
        return f"{req}: builds into {[w.name for w in wheels]}, not a pure-Python wheel"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lock", type=Path, default=Path(__file__).resolve().parents[1] / "requirements.lock")
    args = ap.parse_args(argv)
    reqs = lock_requirements(args.lock)
    problems = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        pip = pip_command(tmp)
        for req in reqs:
            if req.name in PURE_SDISTS and (why := pure_sdist_ok(pip, f"{req.name}{req.specifier}", tmp)):
                problems.append(why)
        targets = [(python, machine) for python in PYTHONS for machine in MACHINES]

        def check(target):
            pins = [f"{r.name}{r.specifier}" for r in reqs if r.name not in PURE_SDISTS and applies(r, *target)]
            return target, len(pins), dry_run(pip, pins, *target, tmp)

        with ThreadPoolExecutor(len(targets)) as pool:  # network-bound: all targets at once
            for (python, machine), n, done in pool.map(check, targets):
                print(f"lock: CPython {python} linux {machine}: {n} pins, {'ok' if done.returncode == 0 else 'NO WHEEL'}")
                if done.returncode:
                    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("ERROR")] or [done.stderr[-600:]]
                    problems.append(f"CPython {python} {machine}: {' / '.join(errors)}")
    for p in problems:
        print(f"lock: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
