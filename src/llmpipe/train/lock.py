"""One trainer per run: a lease on the run's checkpoint folder, and a trainer that dies with its snakemake.

The lease is a JSON file (host, pid, start time, heartbeat) in the checkpoint folder, put in place whole
by link (fails if one exists) and refreshed every HEARTBEAT seconds by atomic rename, so it works on a shared file system
(NFS, FSx, EFS) across nodes. A second trainer refuses at once, naming the holder. A lease is taken
over when its holder is gone: on the same host when its pid no longer runs, from anywhere when its
heartbeat is older than LEASE seconds (a dead node; clocks are assumed within seconds, as NTP keeps
them), but never on its host while a process of the trainer's process group (`group`) runs: a launcher
killed with SIGKILL leaves no one to stop it at once (llmpipe.launch sends it SIGTERM through the kernel,
PR_SET_PDEATHSIG, and it may take a while to stop). A lease that is not ours any more stops the training.
`llmpipe launch --lock` holds it for what it starts; a trainer started otherwise (by hand, `torchrun`,
`colossalai run`) takes it itself (`trainer_lease`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from llmpipe.io import pid_running

LOCK_NAME = ".trainer.lock"
HEARTBEAT = 10.0
LEASE = 60.0
HELD_ENV = "LLMPIPE_TRAINER_LEASE"  # set by llmpipe launch for what it starts: the folder whose lease it holds


class LockHeld(RuntimeError):
    """Another trainer holds the run's checkpoint folder."""


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def holder_gone(holder: dict, now: float, host: str) -> bool:
    if holder.get("host") == host:
        if holder.get("group") and pid_running(int(holder["group"]), group=True):
            return False  # its trainer still runs, whatever became of the launcher (killed with SIGKILL)
        if not pid_running(int(holder.get("pid", 0))):
            return True
    return now - float(holder.get("heartbeat", 0)) > LEASE


class TrainerLock:
    def __init__(self, folder: str | Path, what: str = "trainer"):
        self.path = Path(folder) / LOCK_NAME
        self.host, self.pid, self.what = socket.gethostname(), os.getpid(), what
        self.started = time.time()
        self.group: int | None = None  # the process group of the trainer it runs (set_group)
        self._writing = threading.Lock()  # the heartbeat thread and set_group share one temp file
        self._stop = threading.Event()
        self.lost = threading.Event()
        self.on_lost = None  # called from the heartbeat thread once the lease is lost

    def _record(self) -> dict:
        group = {"group": self.group} if self.group else {}
        return {"host": self.host, "pid": self.pid, **group, "what": self.what, "started": self.started, "heartbeat": time.time()}

    def set_group(self, pgid: int) -> None:
        self.group = pgid
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_name(f"{LOCK_NAME}.{self.host}.{self.pid}.tmp")
        with self._writing:
            tmp.write_text(json.dumps(self._record()))
            os.replace(tmp, self.path)

    def _ours(self) -> bool:
        held = _read(self.path)
        return held is not None and (held.get("host"), held.get("pid")) == (self.host, self.pid)

    def _create(self) -> bool:
        """Put our whole record in place unless a lock exists (link: atomic, also on NFS): never an empty lock
        file, whatever happens between creating and writing it."""
        tmp = self.path.with_name(f"{LOCK_NAME}.{self.host}.{self.pid}.new")
        try:
            tmp.write_text(json.dumps(self._record()))
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def _take_over(self) -> bool:
        self._write()  # take over a dead holder's lease, then make sure no one else did too
        time.sleep(0.2)
        return self._ours()

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            if self._create():
                return self._start_heartbeat()
            held = _read(self.path)
            if held is None:  # being replaced this instant, or unreadable (an older llmpipe's empty lock)
                try:
                    stale = time.time() - self.path.stat().st_mtime > LEASE
                except FileNotFoundError:
                    continue
                if stale and self._take_over():
                    return self._start_heartbeat()
                time.sleep(0.2)
                continue
            if not holder_gone(held, time.time(), self.host):
                age = time.time() - float(held.get("heartbeat", 0))
                group = f", its trainer process group {held['group']}" if held.get("group") else ""
                raise LockHeld(
                    f"{self.path.parent} is held by another {held.get('what', 'trainer')}: pid {held.get('pid')} on "
                    f"host {held.get('host')}{group} (heartbeat {age:.0f} s ago): two trainers would write the same "
                    f"checkpoints. Stop that one, or wait for it; its lock ({self.path}) is released when it exits, "
                    f"or taken over {LEASE:.0f} s after its last heartbeat"
                )
            if self._take_over():
                return self._start_heartbeat()
        raise LockHeld(f"could not take {self.path}: other trainers keep taking it")

    def _start_heartbeat(self) -> None:
        threading.Thread(target=self._beat, name="trainer-lock-heartbeat", daemon=True).start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT):
            if not self._ours():
                self.lost.set()
                if self.on_lost:
                    self.on_lost()
                return
            self._write()

    def release(self) -> None:
        self._stop.set()
        if self._ours():
            self.path.unlink(missing_ok=True)


@contextlib.contextmanager
def trainer_lease(folder: str | Path, prog: str):
    """The lease on checkpoint folder `folder` while a trainer runs, unless llmpipe launch holds it for this
    process (HELD_ENV) or this is not global rank 0 (rank 0 holds it for the run). Held by another: SystemExit
    naming the holder. Lost while training: this process gets SIGTERM, as llmpipe launch would send it."""
    folder = Path(folder).resolve()
    if os.environ.get(HELD_ENV) == str(folder) or os.environ.get("RANK", "0") != "0":
        yield
        return
    made = not folder.exists()
    lock = TrainerLock(folder)
    try:
        lock.acquire()
    except LockHeld as exc:
        raise SystemExit(f"{prog}: {exc}") from None

    def stop() -> None:
        print(f"{prog}: lost the trainer lock {lock.path}: stopping", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    lock.on_lost = stop
    try:
        yield
    finally:
        lock.release()
        if made:  # a trainer that refused its setup leaves no empty checkpoint folder behind
            with contextlib.suppress(OSError):
                folder.rmdir()


def snakemake_ancestor(pid: int | None = None) -> tuple[int, str] | None:
    """(pid, start time) of the nearest ancestor process running snakemake (Linux /proc), or None."""
    pid = os.getppid() if pid is None else pid
    while pid > 1:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        fields = stat[stat.rindex(")") + 2 :].split()
        if is_snakemake(argv):
            return pid, fields[19]  # field 22: start time, which a reused pid does not share
        pid = int(fields[1])  # field 4: ppid
    return None


def is_snakemake(argv: list[str]) -> bool:
    """`snakemake ...` or `python -m snakemake ...` / `python .../bin/snakemake ...` (not a shell whose
    command merely mentions a path with snakemake in it)."""
    names = [os.path.basename(a) for a in argv[:3]]
    if names and names[0] == "snakemake":
        return True
    return (
        len(names) > 1
        and names[0].startswith("python")
        and (names[1] == "snakemake" or (names[1] == "-m" and len(names) > 2 and argv[2] == "snakemake"))
    )


def alive(proc: tuple[int, str]) -> bool:
    try:
        stat = Path(f"/proc/{proc[0]}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[19] == proc[1] and stat[stat.rindex(")") + 2 :].split()[0] != "Z"
