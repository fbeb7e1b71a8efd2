"""One read of the sources for all the shards of a tokenize job.

The job's process reads each source once and deals its documents to the shards (a record goes to shard
record index % num_shards when sources are fewer than shards; whole sources otherwise; a source cut into
byte ranges by get-data is read range by range). With one thread the same process encodes them
(shard_set.ShardSet); with more, worker processes do, each owning some of the shards, and this process
only reads. A document too long to hold (readers.StreamedText) reaches a worker as a spooled file.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

from llmpipe.data import mixture
from llmpipe.data.readers import ReadStats, StreamedText, documents
from llmpipe.data.shard_set import BATCH_CHARS, BATCH_DOCS, ShardSet
from llmpipe.data.sources import assign, doc_id, is_validation
from llmpipe.io import start_worker

SPOOL = ".spool-"  # + pid + "-": documents crossing to the workers; removed at the end (a killed job's: next run)

log = logging.getLogger(__name__)


class ShardedStats:
    """The read stats of several shards behind one ReadStats-like object (readers.documents): a record's
    outcome goes to its shard's stats; a broken source is counted in each shard that reads it."""

    def __init__(self, by_shard: dict[int, ReadStats], num_shards: int):
        self.by_shard, self.num_shards, self.bytes_read = by_shard, num_shards, {}

    def of(self, record_index: int) -> ReadStats:
        return self.by_shard[record_index % self.num_shards]

    def skip(self, err) -> None:
        for i, stats in enumerate(self.by_shard.values()):
            stats.skip(err, quiet=i > 0)


def _keep_all(record_index: int) -> bool:
    return True


def deal(cfg: dict, sources: list[str], shards: list[int], mix: dict | None, stats_of, add) -> None:
    """Read each source once; add(shard, doc id, is validation, text) in each shard's order (its sources
    in order, then records in order), exactly the documents a one-shard read (tokenize_shard) gives."""
    d = cfg["data"]
    n, frac, seed = d["num_shards"], d["val_fraction"], d["split_seed"]
    plans = {s: assign(sources, n, s) for s in shards}

    def read(s_idx, source, stats, keep, stride, part, shard_of):
        for r_idx, text in documents(source, d, stats, mixture.keeper(mix, s_idx, keep), stride, part, streamed=True):
            add(shard_of(r_idx), doc_id(s_idx, r_idx), is_validation(s_idx, r_idx, frac, seed), text)

    if not plans[shards[0]].record_level:  # whole sources, round-robin: each read by its one shard
        for s in shards:
            for s_idx, source in plans[s].sources:
                read(s_idx, source, stats_of(s), _keep_all, None, None, lambda r, s=s: s)
        return
    mine = set(shards)
    for s_idx, source in plans[shards[0]].sources:
        if any(i == s_idx for i, _ in plans[shards[0]].ranges):  # byte ranges: each shard reads its own
            for s in shards:
                keep, stride, part = plans[s].reading(s_idx)
                read(s_idx, source, stats_of(s), keep, stride, part, lambda r, s=s: s)
        elif len(shards) == 1:  # the one-shard read as it always was (a strided scan where it pays)
            keep, stride, part = plans[shards[0]].reading(s_idx)
            read(s_idx, source, stats_of(shards[0]), keep, stride, part, lambda r: shards[0])
        else:
            keep = _keep_all if len(mine) == n else (lambda r: r % n in mine)
            stats = ShardedStats({s: stats_of(s) for s in shards}, n)
            read(s_idx, source, stats, keep, None, None, lambda r: r % n)


def write_shards(cfg: dict, sources: list[str], outs: dict[int, Path], tokenizer_dir, threads: int, key_of, mix) -> list[int]:
    """Tokenize the shards `outs` ({shard: path}) from one read of the sources: in this process (threads 1)
    or in `threads` worker processes fed by it. Returns the shards to write again alone with HF."""
    shards = sorted(outs)
    if threads <= 1 or len(shards) == 1:
        sink = ShardSet(cfg, sources, outs, tokenizer_dir, threads, key_of)
        try:
            deal(cfg, sources, shards, mix, sink.stats, sink.add)
            return sink.finish(cfg["data"]["num_shards"])[1]
        finally:
            sink.close()
    with _Workers(cfg, sources, outs, tokenizer_dir, threads, key_of) as workers:
        deal(cfg, sources, shards, mix, workers.stats, workers.add)
        return workers.finish()


class _Workers:
    """`threads` worker processes, each a ShardSet over every threads-th shard, fed through pipes."""

    def __init__(self, cfg, sources, outs, tokenizer_dir, threads, key_of):
        shards = sorted(outs)
        self.owner = {s: i % threads for i, s in enumerate(shards)}
        self.read_stats = {s: ReadStats() for s in shards}
        self.spool = Path(tempfile.mkdtemp(prefix=f"{SPOOL}{os.getpid()}-", dir=Path(next(iter(outs.values()))).parent))
        ctx = multiprocessing.get_context("spawn")
        self.conns, self.procs = [], []
        for w in range(threads):
            parent, child = ctx.Pipe()
            mine = {s: p for s, p in outs.items() if self.owner[s] == w}
            proc = ctx.Process(
                target=_work, args=(child, cfg, sources, mine, str(tokenizer_dir), key_of, os.getpid()), daemon=True
            )
            proc.start()
            log.info("worker pid %d started at %.3f", proc.pid, time.time())
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        self.buffers = [[] for _ in range(threads)]
        self.chars = [0] * threads

    def __enter__(self):
        return self

    def stats(self, shard: int) -> ReadStats:
        return self.read_stats[shard]

    def add(self, shard: int, did: int, val: bool, text) -> None:
        w = self.owner[shard]
        if isinstance(text, StreamedText):
            text = _spool(text, self.spool)
        self.buffers[w].append((shard, did, val, text))
        self.chars[w] += len(text)
        if len(self.buffers[w]) >= BATCH_DOCS or self.chars[w] >= BATCH_CHARS:
            self._send(w)

    def _send(self, w: int) -> None:
        try:
            self.conns[w].send(("docs", self.buffers[w]))
        except (BrokenPipeError, ConnectionResetError):
            self._raise_from(w)
        self.buffers[w], self.chars[w] = [], 0

    def _raise_from(self, w: int):
        reply = self.conns[w].recv() if self.conns[w].poll(60) else ("error", "worker ended without a word")
        raise SystemExit(f"llmpipe tokenize: error: {reply[1]}")

    def finish(self) -> list[int]:
        redo = []
        for w, conn in enumerate(self.conns):
            self._send(w)
            mine = {s: st for s, st in self.read_stats.items() if self.owner[s] == w}
            try:
                conn.send(("end", mine))
            except (BrokenPipeError, ConnectionResetError):
                self._raise_from(w)
        for w, conn in enumerate(self.conns):
            try:
                kind, value = conn.recv()
            except EOFError:
                kind, value = "error", f"worker {w} ended without a word (killed? out of memory?)"
            if kind == "error":
                raise SystemExit(f"llmpipe tokenize: error: {value}")
            redo += value
        return sorted(redo)

    def __exit__(self, *exc) -> None:
        for conn in self.conns:
            conn.close()
        for proc in self.procs:
            proc.join(timeout=None if exc[0] is None else 5)
            if proc.is_alive():
                proc.terminate()
        for f in self.spool.iterdir():
            f.unlink()
        self.spool.rmdir()


def _spool(text: StreamedText, folder: Path) -> _Spooled:
    fd, path = tempfile.mkstemp(dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8", errors="surrogatepass", newline="") as fh:  # line ends as they are
        for piece in text.chunks():
            fh.write(piece)
    return _Spooled(path, text.chars, text.nbytes, text.nul, text.blank)


class _Spooled:
    """A StreamedText written to a file, to cross to a worker process; opened there as a StreamedText."""

    def __init__(self, path, chars, nbytes, nul, blank):
        self.path, self.chars, self.nbytes, self.nul, self.blank = path, chars, nbytes, nul, blank

    def __len__(self) -> int:
        return self.chars

    def opened(self) -> StreamedText:
        def chunks():
            with open(self.path, encoding="utf-8", errors="surrogatepass", newline="") as fh:  # no \r\n -> \n
                while piece := fh.read(1 << 20):
                    yield piece

        return StreamedText(chunks, self.chars, self.nbytes, self.nul, self.blank)


def _work(conn, cfg, sources, outs, tokenizer_dir, key_of, parent: int) -> None:
    """A worker: encode and write the documents of `outs` as they come; reply the shards to redo. It dies
    with the job (`daemon` does not cover a SIGKILL of it): nothing is written into a killed job's output."""
    start_worker(parent)
    log.info("worker pid %d ready at %.3f (dies with the job)", os.getpid(), time.time())
    sink, spooled = None, []
    gc.disable()  # as shard_set.gc_paused: a process of its own
    try:
        sink = ShardSet(cfg, sources, outs, tokenizer_dir, 1, key_of)
        while True:
            kind, value = conn.recv()
            if kind == "end":
                for shard, stats in value.items():
                    sink.outs[shard].stats = stats
                conn.send(("done", sink.finish(cfg["data"]["num_shards"])[1]))
                return
            for shard, did, val, text in value:
                if isinstance(text, _Spooled):
                    spooled.append(text.path)
                    text = text.opened()
                sink.add(shard, did, val, text)
            if spooled and not sink.pending:  # their documents are written
                for path in spooled:
                    os.unlink(path)
                spooled.clear()
    except EOFError:  # the reader stopped (an error there): leave nothing behind
        pass
    except BaseException as exc:
        with contextlib.suppress(OSError):
            conn.send(("error", str(exc) or type(exc).__name__))
        raise
    finally:
        if sink is not None:
            sink.close()
