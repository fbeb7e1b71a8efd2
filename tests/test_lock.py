"""requirements.lock (scripts/lock.sh) against pyproject.toml: every declared range holds a locked pin,
the CPU-wheel rule holds (no CUDA packages, torch within the declared cap), and this interpreter runs
the locked set (.ci/run installs with -c requirements.lock). That the lock has wheels for CPython
3.11-3.13 on x86_64 and aarch64 is checked by scripts/check_lock_wheels.py in .ci/run (needs PyPI)."""

from __future__ import annotations

import importlib.metadata as md
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from check_lock_wheels import applies, lock_requirements  # noqa: E402

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
DECLARED = [Requirement(r) for r in PROJECT["dependencies"] + PROJECT["optional-dependencies"]["test"]]
HERE = (f"{sys.version_info.major}.{sys.version_info.minor}", "x86_64")


def key(req: Requirement) -> str:
    return canonicalize_name(req.name)  # backports.zstd -> backports-zstd, as the lock writes it


def locked_here() -> dict[str, Requirement]:
    return {key(r): r for r in lock_requirements(REPO / "requirements.lock") if applies(r, *HERE)}


def pin(req: Requirement) -> str:
    (spec,) = req.specifier
    assert spec.operator == "==", req
    return spec.version


def test_every_declared_range_has_a_locked_pin_inside_it():
    locked = locked_here()
    for req in DECLARED:
        name = key(req)
        assert name in locked, f"{req} is declared but not locked: run scripts/lock.sh"
        assert req.specifier.contains(pin(locked[name]), prereleases=True), f"lock {locked[name]} is outside {req}"


def test_lock_keeps_the_cpu_wheel_rule():
    locked = lock_requirements(REPO / "requirements.lock")
    assert not [r.name for r in locked if r.name.startswith(("nvidia-", "cuda-")) or r.name == "triton"]
    (torch,) = [r for r in DECLARED if r.name == "torch"]
    newest_allowed = max(s.version for s in torch.specifier if s.operator in ("<=", "=="))
    assert pin(locked_here()["torch"]) == newest_allowed  # a looser cap would pull CUDA builds


def test_this_interpreter_runs_the_locked_versions():
    locked = locked_here()
    for req in DECLARED:
        want = locked[key(req)]
        have = md.version(req.name)
        assert want.specifier.contains(have, prereleases=True), f"{req.name} {have} installed, lock says {want}"


def test_conda_environments_of_the_main_code_pin_the_locked_versions():
    """envs/torch.yaml and envs/sagemaker.yaml run llmpipe's own steps (--software-deployment-method conda):
    each pin there is the lock's (orjson 3.8.3 stayed there, outside pyproject's range, after the range was raised)."""
    import yaml

    locked = locked_here()
    for env in ("torch.yaml", "sagemaker.yaml"):
        deps = yaml.safe_load((REPO / "envs" / env).read_text())["dependencies"]
        pins = [Requirement(p) for d in deps if isinstance(d, dict) for p in d["pip"]]
        checked = [r for r in pins if key(r) in locked]
        assert len(checked) >= 10, env
        wrong = [f"{r} (lock {locked[key(r)]})" for r in checked if pin(r) != pin(locked[key(r)])]
        assert not wrong, f"envs/{env}: {wrong}"
