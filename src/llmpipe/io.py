"""Atomic writes: build an output under a temporary name, then rename it into place."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import math
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling path; on success it replaces `target` (file or folder)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    _remove(tmp)
    _remove_stale(target)
    try:
        yield tmp
        _default_modes(tmp)
        if tmp.is_dir() and target.exists():
            _remove(target)
        os.replace(tmp, target)
    finally:
        _remove(tmp)


def _remove_stale(target: Path) -> None:
    """Temporary siblings of `target` left by killed writers (`.name.tmp-PID*`, PID not running here)."""
    for stale in target.parent.glob(f".{glob.escape(target.name)}.tmp-*"):
        m = re.match(r"\d+", stale.name[len(target.name) + 6 :])
        if m and int(m.group()) != os.getpid() and not pid_running(int(m.group())):
            _remove(stale)


def pid_running(pid: int) -> bool:
    """Whether a process of this pid runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _default_modes(path: Path) -> None:
    """Some writers (safetensors) create 0600 files; give outputs the usual umask-based modes."""
    umask = os.umask(0)
    os.umask(umask)
    paths = [path, *path.rglob("*")] if path.is_dir() else [path]
    for p in paths:
        if p.is_symlink() or not p.exists():
            continue
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~umask)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def finite(data, where: str = "") -> tuple[object, list[str]]:
    """`data` with every NaN / Infinity float replaced by None, and the dotted paths where that happened."""
    if isinstance(data, float) and not math.isfinite(data):
        return None, [where or "<value>"]
    if isinstance(data, dict):
        out, bad = {}, []
        for k, v in data.items():
            out[k], b = finite(v, f"{where}.{k}" if where else str(k))
            bad += b
        return out, bad
    if isinstance(data, (list, tuple)):
        pairs = [finite(v, f"{where}[{i}]") for i, v in enumerate(data)]
        return [v for v, _ in pairs], [x for _, b in pairs for x in b]
    return data, []


def dumps(data, **kwargs) -> str:
    """Strict JSON (no bare NaN / Infinity, which strict parsers reject): non-finite numbers become null
    and a mapping lists them under "nonfinite"."""
    clean, bad = finite(data)
    if bad and isinstance(clean, dict):
        clean["nonfinite"] = bad
    return json.dumps(clean, allow_nan=False, **kwargs)


def write_json(path: str | Path, data) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(dumps(data, indent=2, sort_keys=True) + "\n")


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()
