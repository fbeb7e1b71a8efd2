"""Shards read apart: a tokenize job whose shards share no source bytes, written by a pool of processes.

When each shard of a job reads bytes no other shard reads (whole sources dealt round-robin, or a file cut
into byte ranges), one reader feeding the workers (job_reader) would only add a bottleneck: each pool
process instead writes one shard at a time as a one-shard job does (tokenize.write_checked), reading its
own bytes, and takes the next shard when done. The parent sums the bytes each read (readers.SOURCE_BYTES)
and collects their checksums, so read.json is the one a single process writes.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
from multiprocessing.connection import wait
from pathlib import Path

from llmpipe.data.sources import assign
from llmpipe.io import remove_stale, start_worker

log = logging.getLogger(__name__)


def reads_apart(sources: list[str], num_shards: int, shards) -> bool:
    """Whether each of `shards` reads only bytes of its own: whole sources, or byte ranges of cut files."""
    for shard in shards:
        plan = assign(sources, num_shards, shard)
        if plan.record_level and {i for i, _ in plan.sources} != {i for i, _ in plan.ranges}:
            return False
    return True


def write_apart(
    write_one, cfg: dict, sources: list[str], entries: list[dict], outs: dict[int, Path], tokenizer_dir, processes: int, key, mix
):
    """Write the shards `outs` ({shard: path}) in `processes` processes, each taking the next shard when done
    and writing it alone with `write_one` (tokenize.write_checked, a module-level function: it crosses to the
    processes by name); returns their checksums and adds their bytes read to SOURCE_BYTES. An error in
    one, or one killed, ends the job: the others are stopped and every shard of the job removed, so none
    stays looking complete."""
    from llmpipe.data.readers import SOURCE_BYTES

    ctx = multiprocessing.get_context("spawn")
    job = (write_one, cfg, sources, entries, {s: str(p) for s, p in outs.items()}, str(tokenizer_dir), key, mix)
    todo, sums, procs, error, ended = sorted(outs), [], {}, None, False
    try:
        for _ in range(min(processes, len(todo))):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(theirs, os.getpid(), job), daemon=True)
            try:
                proc.start()
            except BaseException:
                mine.close()
                raise
            finally:
                theirs.close()  # so a process's death reads as EOF here
            procs[mine] = proc
            mine.send(todo.pop(0))
        busy = set(procs)
        while busy and error is None:
            for conn in wait(list(busy)):
                nxt = None
                try:
                    shard, read, shard_sums, error = conn.recv()
                    if error is None:
                        nxt = todo.pop(0) if todo else None
                        conn.send(nxt)  # None: it ends
                except (EOFError, BrokenPipeError, ConnectionResetError):
                    error = f"a tokenize process (pid {procs[conn].pid}) ended without a word (killed? out of memory?)"
                if error is not None:
                    break
                SOURCE_BYTES.update(read)
                sums += shard_sums
                log.info("shard %d written", shard)
                if nxt is None:
                    busy.discard(conn)
        ended = error is None
    finally:
        for conn, proc in procs.items():
            conn.close()
            if not ended:
                proc.terminate()
            proc.join()
        if not ended:  # an error, or this process interrupted: the shards written and what the stopped wrote
            for path in outs.values():
                path.unlink(missing_ok=True)
                remove_stale(path)
    if error is not None:
        raise SystemExit(f"llmpipe tokenize: error: {error}")
    return sorted(map(list, {tuple(s) for s in sums}))  # empty byte ranges at one offset: listed once


def _serve(conn, parent: int, job: tuple) -> None:
    """A pool process: writes the shards it is sent, one at a time, until sent None. It dies with the job
    (`daemon` does not cover a SIGKILL of it)."""
    start_worker(parent)
    log.info("worker pid %d ready (a pool process; dies with the job)", os.getpid())
    with contextlib.suppress(EOFError, BrokenPipeError):  # the job ended
        while (shard := conn.recv()) is not None:
            conn.send(_one(shard, job))


def _one(shard: int, job: tuple) -> tuple:
    """(shard, bytes read by source, checksums, error message or None) of one shard written alone."""
    from llmpipe.data.readers import SOURCE_BYTES, SOURCE_HASHES

    write_one, cfg, sources, entries, outs, tokenizer_dir, key, mix = job
    out = {shard: Path(outs[shard])}
    SOURCE_BYTES.clear()
    SOURCE_HASHES.clear()
    try:
        sums = write_one(cfg, sources, entries, out, tokenizer_dir, 1, key, mix)
    except Exception as exc:  # one line to the parent; the traceback stays in this process's log
        log.exception("shard %d", shard)
        return shard, {}, [], str(exc) or type(exc).__name__
    return shard, dict(SOURCE_BYTES), sums, None
