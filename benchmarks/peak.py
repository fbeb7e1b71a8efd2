"""Peak memory of a command, one way for every benchmark. run_alone: one process, its own ru_maxrss
(os.wait4), which includes what it shared with this one between fork and exec, so the caller must be a
small process (these benchmark drivers are, ~50 MB). sampled: a process tree, RSS summed over it every
50 ms (for commands that start processes of their own)."""

from __future__ import annotations

import os
import resource
import subprocess
import tempfile
import threading
import time
from pathlib import Path


def run_alone(cmd: list[str], **popen) -> tuple[float, int, str]:
    with tempfile.TemporaryFile("w+") as out:  # a file, not a pipe: a chatty command cannot fill it and stall
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, **popen)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        text = out.read()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed:\n{text[-3000:]}")
    return wall, usage.ru_maxrss * 1024, text


PAGE = os.sysconf("SC_PAGE_SIZE")


def tree_rss(root: int) -> int:
    """Sum of the resident set sizes of `root` and all its descendants, from one read of /proc/N/stat
    per process (ppid and rss are both there): cheap enough to sample often without slowing the run."""
    parent, rss = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rpartition(b")")[2].split()
        except OSError:  # the process ended while we listed it
            continue
        pid = int(name)
        parent[pid], rss[pid] = int(fields[1]), int(fields[21]) * PAGE
    total, todo = 0, [root]
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total


def tree_anon(root: int) -> int:
    """Anonymous memory (RssAnon: the heap, not the file pages a process has mapped, which the kernel can
    drop) of `root` and its descendants, from /proc/N/status."""
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            todo += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except OSError:
            continue
        total += next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("RssAnon:")), 0)
    return total


def children_cpu() -> float:
    """CPU seconds (user + system) of every child process waited for so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def sampled(cmd: list[str], env: dict, anon_too: bool = False) -> tuple[str, float, float, int, int]:
    """Run a command; (its stdout, wall s, CPU s of its tree, peak tree RSS, peak tree RssAnon), the peaks
    sampled every 50 ms (for commands that start processes of their own)."""
    start, cpu = time.perf_counter(), children_cpu()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = [0, 0]

    def poll():
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_rss(proc.pid))
            if anon_too:
                peak[1] = max(peak[1], tree_anon(proc.pid))
            time.sleep(0.05)

    t = threading.Thread(target=poll)
    t.start()
    out, err = proc.communicate()
    t.join()
    if proc.returncode:
        raise SystemExit(f"{cmd} failed:\n{err[-3000:]}")
    return out, time.perf_counter() - start, children_cpu() - cpu, peak[0], peak[1]
