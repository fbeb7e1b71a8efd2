"""Run one command alone: (wall seconds, peak RSS in bytes, its output). The peak is that process's own
ru_maxrss (os.wait4). It includes what the process shared with this one between fork and exec, so the
caller must be a small process (these benchmark drivers are, ~50 MB)."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time


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
