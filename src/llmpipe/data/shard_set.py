"""The token-store shards one process writes: documents in (in each shard's order), shard files out.

Every shard is encoded as if it were written alone (`tokenize_shard`), so one read of the sources can
feed many shards: the encoder check runs on each shard's own first documents (the sample a one-shard job
takes: the first SAMPLE_DOCS of its first batch of BATCH_DOCS documents or BATCH_CHARS characters), while
documents are encoded as they come by the fast encoder. A shard whose check fails (tokenizer.backend auto)
is written again alone with the HF tokenizer (`redo`), as a one-shard job would have chosen.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import logging
import os
import time
from array import array
from collections import Counter
from itertools import accumulate
from pathlib import Path
from struct import pack

import numpy as np

from llmpipe.data import long_docs, stfile
from llmpipe.data.encoders import SAMPLE_HEAD_CHARS, encoders, sample_agrees
from llmpipe.data.long_docs import EncodeError, describe_doc
from llmpipe.data.readers import ReadStats, locate
from llmpipe.data.sources import RECORD_BITS
from llmpipe.data.tokenizer import load_backend, tokenizer_info
from llmpipe.io import WriteOnce

log = logging.getLogger(__name__)

SPLITS = ("train", "val")
BATCH_DOCS, BATCH_CHARS, SAMPLE_DOCS = 256, 2 << 20, 64
HEADER_ROOM = 16 << 10  # bytes before a shard's train tokens, for its safetensors header (more: the file is copied)
FILES_MARGIN = 128  # open files a process needs besides its shards' 2 split files each (sources, pipes, libraries)


def open_files_limit() -> int:
    """This process's soft limit on open files (1024 on many Slurm and login nodes)."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if soft != resource.RLIM_INFINITY else 1 << 30


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def use_bos(policy: str, adds_bos: bool) -> bool:
    return policy == "always" or (policy == "auto" and adds_bos)


@contextlib.contextmanager
def gc_paused():
    """The cyclic garbage collector off: encoding makes millions of int lists and no cycles, and its passes
    over them cost ~2 % of a tokenize job."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class SplitWriter:
    """One split's token file, the tokens from byte `start` on (before: room for the shard file's header);
    `lazy`: opened only while written (a process writing thousands of shards)."""

    def __init__(self, path: Path, dtype: np.dtype, lazy: bool = False, start: int = 0):
        self.path, self.dtype, self.lazy, self.start = path, dtype, lazy, start
        self._fh = WriteOnce(path, start=start, keep=True)  # pack reads it next
        self.offsets, self.doc_ids = array("q", [0]), array("q")
        self.sha = hashlib.sha256()
        self.release()

    @property
    def fh(self):
        if self._fh is None:
            self._fh = WriteOnce(self.path, append=True, keep=True)
        return self._fh

    def release(self) -> None:
        if self.lazy:
            self.close()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def add_batch(self, docs: list[list[int]], dids: list[int], prefix: list[int], suffix: list[int]) -> None:
        """Documents, each as prefix + ids + suffix, little-endian in the writer's dtype. struct.pack per
        document: about twice as fast as np.fromiter over the chained lists."""
        if not docs:
            return
        code, extra = self.dtype.char, len(prefix) + len(suffix)  # B, H, I: struct's codes for the same types
        data = b"".join(pack(f"<{len(d) + extra}{code}", *prefix, *d, *suffix) for d in docs)
        self.fh.write(data)
        self.sha.update(data)
        ends = accumulate((len(d) + extra for d in docs), initial=self.offsets[-1])
        next(ends)  # the running total it starts from, already there
        self.offsets.extend(ends)
        self.doc_ids.extend(dids)

    def add_tokens(self, tokens: np.ndarray, lengths: np.ndarray, dids: list[int]) -> None:
        """Documents already laid out as one array (prefix + ids + suffix each; any unsigned dtype that
        holds them) with each one's length: the same bytes as add_batch."""
        if not len(dids):
            return
        data = tokens.astype(self.dtype.newbyteorder("<"), copy=False)
        self.fh.write(data)
        self.sha.update(data)
        self.offsets.frombytes((np.cumsum(lengths, dtype=np.int64) + self.offsets[-1]).astype("<i8").tobytes())
        self.doc_ids.extend(dids)

    def counts(self) -> dict:
        return {"documents": len(self.doc_ids), "tokens": self.offsets[-1]}


class ShardOutput:
    """One shard being written under a temporary name: its split files, read stats, encoder check."""

    def __init__(self, shard: int, path: Path, dtype: np.dtype, lazy: bool = False):
        self.shard, self.path = shard, Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        # train tokens straight into the shard file, after room for its header; val (few) in a side file
        self.writers = {
            "train": SplitWriter(self.tmp, dtype, lazy, start=HEADER_ROOM),
            "val": SplitWriter(self.tmp.with_name(self.tmp.name + ".val.bin"), dtype, lazy),
        }
        self.stats, self.long = ReadStats(), Counter()
        self.seen = 0  # documents given
        self.started = None  # time.time() of its first document
        self.checked = 0  # of its first SAMPLE_DOCS documents, compared with the HF tokenizer so far
        self.mode = "open"  # open (being checked) | done (checked) | redo (tiktoken differed: written again alone)

    def discard(self) -> None:
        for w in self.writers.values():
            w.close()
            w.path.unlink(missing_ok=True)

    def finish(self, tokenizer: dict, place: dict, encoder: str, dtype: np.dtype) -> dict:
        """Close the split files and write the shard (safetensors, atomically); returns its counts."""
        for w in self.writers.values():
            w.close()
        counts = {s: w.counts() for s, w in self.writers.items()}
        self.stats.long.update(self.long)
        meta = {
            **tokenizer,
            "counts": json.dumps(counts),
            "read": json.dumps(self.stats.as_dict()),
            "encoder": encoder,
            **place,
            **{f"sha256.{s}": w.sha.hexdigest() for s, w in self.writers.items()},
        }
        tensors = {}
        for s, w in self.writers.items():
            size = w.path.stat().st_size - w.start
            tensors[f"{s}.tokens"] = (dtype, (w.path, w.start, size) if w.start else w.path)
            tensors[f"{s}.offsets"] = (np.int64, np.frombuffer(w.offsets, dtype=np.int64))
            tensors[f"{s}.doc_ids"] = (np.int64, np.frombuffer(w.doc_ids, dtype=np.int64))
        try:
            if not stfile.finish_in_place(self.tmp, HEADER_ROOM, tensors, meta):  # a header over the room: copied
                moved = self.tmp.with_name(self.tmp.name + ".train.bin")
                os.replace(self.tmp, moved)
                self.writers["train"].path = moved
                _, _, size = tensors["train.tokens"][1]
                tensors["train.tokens"] = (dtype, (moved, HEADER_ROOM, size))
                stfile.write(self.tmp, tensors, meta)
            os.replace(self.tmp, self.path)
        finally:
            self.tmp.unlink(missing_ok=True)
            self.discard()
        return counts


class ShardSet:
    """Encode and write the documents of `outs` ({shard: output path}); `add` them in each shard's order.
    `key_of(tokenizer sha256)`: the shards' key (tokenize.shard_key)."""

    def __init__(self, cfg: dict, sources: list[str], outs: dict[int, Path], tokenizer_dir, threads: int = 1, key_of=None):
        d = cfg["data"]
        self.cfg, self.sources = cfg, sources
        tok = load_backend(tokenizer_dir)
        self.info = info = tokenizer_info(tokenizer_dir, tok)
        self.bos = use_bos(d["add_bos"], info.adds_bos)
        if self.bos and info.bos_id is None:
            raise ValueError(f"data.add_bos is 'always' but tokenizer {tokenizer_dir} has no bos_token")
        self.dtype = token_dtype(info.vocab_size)
        self.prefix, self.eos = ([info.bos_id] if self.bos else []), [info.eos_id]
        self.backend = cfg["tokenizer"]["backend"]
        self.hf, self.fast = encoders(tokenizer_dir, self.backend, threads, tok, d.get("long_pretoken", "split"))
        if self.fast is not None and not sample_agrees(self.hf, self.fast, self.backend, []):  # the fixed probes
            self.fast = None
        self.key = key_of(info.sha256) if key_of else ""
        lazy = 2 * len(outs) + FILES_MARGIN > open_files_limit()  # split files open only while written
        self.outs = {s: ShardOutput(s, p, self.dtype, lazy) for s, p in outs.items()}
        self.pending: list[tuple] = []
        self.chars = 0
        self.start = time.time()

    def stats(self, shard: int) -> ReadStats:
        return self.outs[shard].stats

    def add(self, shard: int, did: int, val: bool, text) -> None:
        out = self.outs[shard]
        if out.mode == "redo":
            return
        if not out.seen:
            out.started = time.time()
        out.seen += 1
        self.pending.append((shard, did, val, text))
        self.chars += len(text)
        if len(self.pending) >= BATCH_DOCS or self.chars >= BATCH_CHARS:
            self.flush()

    def flush(self) -> None:
        if self.fast is not None:
            self._check()
        groups: dict[int, list] = {}
        for shard, *item in self.pending:
            groups.setdefault(shard, []).append(item)
        self.pending, self.chars = [], 0
        for shard, batch in groups.items():
            out = self.outs[shard]
            if out.mode != "redo":
                with self._naming(batch):
                    self._encode(out, batch)

    def _check(self) -> None:
        """The fast encoder against HF on the heads of each shard's first SAMPLE_DOCS documents: a shard
        where they differ is written again alone with HF (tokenizer.backend tiktoken: stop)."""
        heads, whose, sizes = [], [], []
        for shard, did, _, text in self.pending:
            out = self.outs[shard]
            if out.mode == "open":
                heads.append(text[:SAMPLE_HEAD_CHARS] if isinstance(text, str) else "")  # not a streamed one
                whose.append((out, did))
                sizes.append(len(text))
                out.checked += 1
                out.mode = "done" if out.checked >= SAMPLE_DOCS else "open"
        if not heads:
            return
        with self._naming([(did, None, None) for _, did in whose]):
            where = [describe_doc(self.sources, did) for _, did in whose]
            try:
                want, got = self.hf.encode_batch(heads, where), self.fast.encode_batch(heads, where)
            except EncodeError as exc:  # on a head: name the whole document's size, as encoding it would
                i = where.index(exc.where)
                if len(heads[i]) < sizes[i] and exc.__cause__ is not None:
                    raise EncodeError(exc.where, sizes[i], exc.__cause__) from exc.__cause__
                raise
        bad = {out.shard for (out, _), a, b in zip(whose, want, got) if a != b}
        if bad and self.backend == "tiktoken":
            raise ValueError(f"tiktoken ids differ from the HF tokenizer on the first documents of shards {sorted(bad)}")
        for shard in bad:
            log.warning("shard %d: tiktoken ids differ from the HF tokenizer on its first documents: written with HF", shard)
            self.outs[shard].mode = "redo"
        self.pending = [p for p in self.pending if p[0] not in bad]

    @contextlib.contextmanager
    def _naming(self, batch: list):
        """A tokenizer failure on one of `batch`'s documents names its file and line."""
        try:
            yield
        except EncodeError as exc:
            did = next(did for did, _, _ in batch if describe_doc(self.sources, did) == exc.where)
            record = did & ((1 << RECORD_BITS) - 1)
            line = locate(self.sources[did >> RECORD_BITS], self.cfg["data"], record)
            ranged = getattr(self.sources[did >> RECORD_BITS], "ranges", None)  # the record index is a byte offset
            raise exc.relabel(line if ranged else f"{line or self.sources[did >> RECORD_BITS]} (record {record})") from exc

    def _encode(self, out: ShardOutput, batch: list) -> None:
        encoder = self.fast or self.hf
        if encoder is self.fast and self._encode_joined(out, batch):
            return
        before = Counter(encoder.stats)
        where = [describe_doc(self.sources, did) for did, _, _ in batch]  # named if the tokenizer fails
        parts = {s: ([], []) for s in SPLITS}
        for (did, val, _), ids in zip(batch, encoder.encode_batch([t for _, _, t in batch], where, stream=True)):
            s = "val" if val else "train"
            encoded, dids = parts[s]
            if ids is None:  # dropped under data.long_pretoken: skip (counted in encoder.stats)
                continue
            if not isinstance(ids, list):  # a long document's pieces: written as encoded, after the ones before it
                out.writers[s].add_batch(encoded, dids, self.prefix, self.eos)
                encoded.clear()
                dids.clear()
                long_docs.write_pieces(out.writers[s], did, self.prefix, ids, self.eos)
                continue
            encoded.append(ids)
            dids.append(did)
        for s, (encoded, dids) in parts.items():
            out.writers[s].add_batch(encoded, dids, self.prefix, self.eos)
            out.writers[s].release()
        out.long.update(Counter(encoder.stats) - before)

    def _encode_joined(self, out: ShardOutput, batch: list) -> bool:
        """Each split's documents of `batch` in one tiktoken call (TiktokenEncoder.encode_docs): False, nothing
        written, where that call does not apply or fails (the per-document path then names the document)."""
        parts = []
        for s in SPLITS:
            mine = [(did, text) for did, val, text in batch if val == (s == "val")]
            try:
                encoded = self.fast.encode_docs([t for _, t in mine], self.prefix, self.eos) if mine else None
            except (KeyboardInterrupt, SystemExit, GeneratorExit):
                raise
            except BaseException as exc:  # pyo3's PanicException is a BaseException
                log.warning("tiktoken's joined call failed (%s): this batch goes document by document", exc)
                return False
            if mine and encoded is None:
                return False
            parts.append((s, [did for did, _ in mine], encoded))
        for s, dids, encoded in parts:
            if dids:
                out.writers[s].add_tokens(*encoded, dids)
            out.writers[s].release()
        return True

    def finish(self, num_shards: int) -> tuple[dict, list[int]]:
        """Write every shard whose check passed: ({shard: counts}, [shards to write again alone, with HF])."""
        self.flush()
        counts, redo = {}, []
        tokenizer = {
            "tokenizer_sha256": self.info.sha256,
            "eos_id": str(self.info.eos_id),
            "bos_id": str(self.info.bos_id if self.bos else -1),
            "vocab_size": str(self.info.vocab_size),
        }
        for shard, out in self.outs.items():
            if out.mode == "redo":
                out.discard()
                redo.append(shard)
                continue
            encoder = (self.fast or self.hf).name if out.seen else "none"
            place = {"shard": f"{shard}/{num_shards}", "key": self.key}
            counts[shard] = out.finish(tokenizer, place, encoder, self.dtype)
            log.info(
                "shard %d/%d: %s, read %s, encoder %s, bos %s",
                shard,
                num_shards,
                counts[shard],
                out.stats.as_dict(),
                encoder,
                self.bos,
            )
            log.info("shard %d written by pid %d from %.3f to %.3f", shard, os.getpid(), out.started or time.time(), time.time())
        return counts, redo

    def close(self) -> None:
        """Remove what an unfinished run left (temporary split files)."""
        for out in self.outs.values():
            out.discard()
            out.tmp.unlink(missing_ok=True)
