"""Atomic writes: build an output under a temporary name, then rename it into place."""

from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import io
import json
import math
import mmap
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
    remove_stale(target)
    try:
        yield tmp
        _default_modes(tmp)
        if tmp.is_dir() and target.exists():  # a folder cannot replace a folder in one rename
            old = tmp.with_name(f"{tmp.name}-old")  # removed as stale if this process is killed
            os.replace(target, old)  # a kill from here on leaves no output, never a half-removed one
            try:
                os.replace(tmp, target)
            except BaseException:
                os.replace(old, target)
                raise
            _remove(old)
        else:
            os.replace(tmp, target)
    finally:
        _remove(tmp)


def remove_stale(target: Path) -> None:
    """Temporary siblings of `target` left by killed writers (`.name.tmp-PID*`, PID not running here)."""
    for stale in target.parent.glob(f".{glob.escape(target.name)}.tmp-*"):
        m = re.match(r"\d+", stale.name[len(target.name) + 6 :])
        if m and int(m.group()) != os.getpid() and not pid_running(int(m.group())):
            _remove(stale)


LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"  # every llmpipe process, workers included
# query parameters that carry a credential: S3 / GCS / Azure presigned URLs, bearer tokens
SECRET_QUERY = re.compile(
    r"[?&](x-amz-(signature|credential|security-token)|x-goog-(signature|credential)|awsaccesskeyid|signature|sig|"
    r"token|access_token|api_key|apikey)=",
    re.I,
)
_SECRET_VALUE = re.compile(SECRET_QUERY.pattern + r"[^&\s'\"<>]*", re.I)
QUIET_LOGGERS = ("httpx", "httpx2", "httpcore")  # log every request URL at INFO: the Hub's presigned CDN URLs too


def redact(text: str) -> str:
    """`text` with the value of every credential-bearing query parameter replaced (a presigned URL's signature,
    credential and token)."""
    return _SECRET_VALUE.sub(lambda m: m.group()[: m.group().index("=") + 1] + "<redacted>", text)


def setup_logging() -> None:
    """INFO logging in LOG_FORMAT, as every llmpipe process logs: HTTP clients' per-request lines off, and no
    line carries a presigned URL's credentials (redacted on the way out, whatever library logged it)."""
    import logging

    class Redact(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            message = record.getMessage()
            if SECRET_QUERY.search(message):
                record.msg, record.args = redact(message), None
            return True

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    for handler in logging.getLogger().handlers:
        if not any(type(f).__name__ == "Redact" for f in handler.filters):
            handler.addFilter(Redact())
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def start_worker(parent: int) -> None:
    """A job's worker process: killed (SIGKILL) when the job dies, and logging as the job does."""
    import signal

    die_with_parent(parent, signal.SIGKILL)
    setup_logging()


def die_with_parent(parent: int, sig: int) -> None:
    """Linux: the kernel sends this process `sig` when its parent dies (PR_SET_PDEATHSIG; a killed job's
    workers would otherwise go on writing into its output); exits at once if `parent` is already gone."""
    import sys

    if sys.platform != "linux":
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def remove_stale_dirs(folder: Path, prefix: str) -> None:
    """Folders `prefix<PID>-*` in `folder` left by killed processes (PID not running here)."""
    for stale in folder.glob(f"{glob.escape(prefix)}*"):
        m = re.match(r"(\d+)-", stale.name[len(prefix) :])
        if stale.is_dir() and m and int(m.group(1)) != os.getpid() and not pid_running(int(m.group(1))):
            shutil.rmtree(stale, ignore_errors=True)


def pid_running(pid: int, group: bool = False) -> bool:
    """Whether a process of this pid (group: of this process group) runs on this host."""
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _default_modes(path: Path) -> None:
    """Some writers (safetensors) create 0600 files; give outputs the usual umask-based modes. A file with
    other hard links (download-model links the Hub cache's blobs) keeps its mode: it is the other name's too."""
    umask = os.umask(0)
    os.umask(umask)
    paths = [path, *path.rglob("*")] if path.is_dir() else [path]
    for p in paths:
        if p.is_symlink() or not p.exists() or (not p.is_dir() and p.stat().st_nlink > 1):
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
    """Hex sha256 of a file (one reused buffer, hashed without the GIL)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


# 16 MiB, not 64: pack of the 10x hf view alone took a median 1.61 s against 1.98 s (system time 1.40 vs 1.91 s;
# docs/benchmarks.md)
WRITE_BEHIND_WINDOW = 16 << 20


@functools.cache
def _sync_file_range():
    """libc's sync_file_range, or None (not Linux); looked up by the first WriteOnce, not at import."""
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):  # not Linux
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    return fn


_WAIT_BEFORE, _WRITE, _WAIT_AFTER = 1, 2, 4  # SYNC_FILE_RANGE_* (linux/fs.h)


class WriteOnce(io.FileIO):
    """A new file written front to back and read later by another step (views, shards): every
    WRITE_BEHIND_WINDOW bytes go to the disk while the next window is written, and a window already on
    disk leaves the page cache (Linux; elsewhere a plain file). So writing N GB needs two windows of page
    cache instead of N GB: at terabyte scale the cache would not keep the file anyway, and on a VM the
    first touch of each new page of guest memory costs more than the disk write (docs/benchmarks.md).
    `keep`: plain writes, the pages stay cached, for a file the next step reads at once (the token-store
    shards, which pack reads right after: measured cheaper than reading them back from the disk)."""

    def __init__(self, path: str | Path, append: bool = False, start: int = 0, keep: bool = False):
        """`append`: write on at the end of an existing file; `start`: a new file written from that byte on
        (the bytes before it left as a hole, to be filled later)."""
        super().__init__(path, "ab" if append else "wb")
        if start:
            self.truncate(start)
            self.seek(start)
        self.pos = os.fstat(self.fileno()).st_size if append else start  # where the next byte goes
        self.started = self.dropped = self.pos - self.pos % mmap.PAGESIZE  # handed to the disk; left the cache
        self.sync_range = _sync_file_range()
        self.behind = self.sync_range is not None and not keep  # off: plain writes

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):  # at most a window at a time; FileIO may write less than asked
            n = super().write(view[done : done + WRITE_BEHIND_WINDOW])
            done += n
            self.pos += n
            if self.behind and self.pos - self.started >= WRITE_BEHIND_WINDOW:
                self._behind()
        return done

    def _behind(self) -> None:
        fd = self.fileno()
        if self.started > self.dropped:  # the previous window: wait for it, then drop it
            self.sync_range(fd, self.dropped, self.started - self.dropped, _WAIT_BEFORE | _WRITE | _WAIT_AFTER)
            try:
                os.posix_fadvise(fd, self.dropped, self.started - self.dropped, os.POSIX_FADV_DONTNEED)
            except OSError:  # a file system without it: plain writes from here on
                self.behind = False
                return
            self.dropped = self.started
        end = self.pos - self.pos % mmap.PAGESIZE  # whole pages: a range's partial pages stay cached
        self.sync_range(fd, self.started, end - self.started, _WRITE)  # start this one
        self.started = end
