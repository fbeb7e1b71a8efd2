"""tokenize (scatter): one shard of the sources -> one token-store shard, streaming.

Output: a safetensors file holding, per split, `<split>.tokens` (every document's ids, BOS first
when the policy says so, EOS last), `<split>.offsets` (document boundaries) and `<split>.doc_ids`
(source index << 40 | record index); metadata: tokenizer fingerprint, counts, read stats, sha256.
Memory stays flat: tokens go to temporary files as they are made.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import logging
import os
import time
from array import array
from itertools import accumulate
from pathlib import Path
from struct import pack

import numpy as np
from tqdm import tqdm

from llmpipe import config as cfgmod
from llmpipe.data import mixture, stfile
from llmpipe.data.long_docs import EncodeError, describe_doc
from llmpipe.data.readers import BadRecord, ReadStats, documents, locate
from llmpipe.data.sources import RECORD_BITS, assign, doc_id, is_validation
from llmpipe.data.tokenizer import load_backend, make_encoder, tokenizer_info
from llmpipe.io import atomic_path

log = logging.getLogger(__name__)

SPLITS = ("train", "val")
BATCH_DOCS, BATCH_CHARS, SAMPLE_DOCS = 256, 2 << 20, 64


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def use_bos(policy: str, adds_bos: bool) -> bool:
    return policy == "always" or (policy == "auto" and adds_bos)


class _SplitWriter:
    def __init__(self, path: Path, dtype: np.dtype):
        self.path, self.dtype = path, dtype
        self.fh = open(path, "wb")
        self.offsets, self.doc_ids = array("q", [0]), array("q")
        self.sha = hashlib.sha256()

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

    def counts(self) -> dict:
        return {"documents": len(self.doc_ids), "tokens": self.offsets[-1]}


@contextlib.contextmanager
def _gc_paused():
    """The cyclic garbage collector off: encoding makes millions of int lists and no cycles, and its passes
    over them cost ~2 % of a tokenize job."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# Data settings that change the tokens of a shard (the rest only change views). data.range_split_bytes is
# not listed (that would change every shard's key, hence every store's bytes): where it splits a source the
# byte ranges are in that source's sources.json entry, so in the sources key that shard_key includes.
TOKEN_KEYS = (
    "sources",
    "text_field",
    "text_mode",
    "hf_config",
    "hf_split",
    "hf_revision",
    "max_records_per_source",
    "max_document_chars",
    "on_bad_record",
    "num_shards",
    "val_fraction",
    "split_seed",
    "add_bos",
)


def shard_key(d: dict, sources_key: str, tokenizer_sha: str) -> str:
    """What produced a shard's tokens: input checksums, tokenizer file, data parameters."""
    params = {k: d[k] for k in TOKEN_KEYS}
    if d.get("long_pretoken", "split") != "split":  # only then: the keys of every other setup stay as they were
        params["long_pretoken"] = d["long_pretoken"]
    params = json.dumps(params, sort_keys=True)
    return hashlib.sha256(f"{sources_key}:{tokenizer_sha}:{params}".encode()).hexdigest()


def tokenize_shard(
    cfg: dict,
    sources: list[str],
    shard: int,
    tokenizer_dir: str | Path,
    out: str | Path,
    threads: int = 1,
    sources_key: str = "",
    mix: dict | None = None,
) -> dict:
    """`mix`: the mixture plan of sources.json (data/mixture.py), if the sources are weighted."""
    d = cfg["data"]
    plan = assign(sources, d["num_shards"], shard)
    tok = load_backend(tokenizer_dir)
    info = tokenizer_info(tokenizer_dir, tok)
    bos = use_bos(d["add_bos"], info.adds_bos)
    if bos and info.bos_id is None:
        raise ValueError(f"data.add_bos is 'always' but tokenizer {tokenizer_dir} has no bos_token")
    dtype = token_dtype(info.vocab_size)
    prefix, eos = ([info.bos_id] if bos else []), [info.eos_id]
    stats = ReadStats()
    out = Path(out)

    def docs():
        for s_idx, source in plan.sources:
            # keep, stride (readers._strided_lines) or the byte range get_data cut for this shard (a large plain JSONL)
            keep, stride, part = plan.reading(s_idx)
            # streamed: a record too long to hold comes as a readers.StreamedText, encoded in pieces (long_docs)
            for r_idx, text in documents(source, d, stats, mixture.keeper(mix, s_idx, keep), stride, part, streamed=True):
                yield doc_id(s_idx, r_idx), is_validation(s_idx, r_idx, d["val_fraction"], d["split_seed"]), text

    with atomic_path(out) as tmp, _gc_paused():
        writers = {s: _SplitWriter(tmp.with_name(tmp.name + f".{s}.bin"), dtype) for s in SPLITS}
        encoder = None
        try:
            batch, chars = [], 0

            def flush():
                from llmpipe.data.long_docs import write_pieces

                nonlocal encoder
                where = [describe_doc(sources, did) for did, _, _ in batch]  # named if the tokenizer fails
                if encoder is None:
                    sample = [t if isinstance(t, str) else "" for _, _, t in batch[:SAMPLE_DOCS]]  # not a streamed one
                    policy, backend = d.get("long_pretoken", "split"), cfg["tokenizer"]["backend"]
                    encoder = make_encoder(tokenizer_dir, backend, sample, threads, tok, policy, where[:SAMPLE_DOCS])
                parts = {s: ([], []) for s in SPLITS}
                for (did, val, _), ids in zip(batch, encoder.encode_batch([t for _, _, t in batch], where, stream=True)):
                    s = "val" if val else "train"
                    encoded, dids = parts[s]
                    if ids is None:  # dropped under data.long_pretoken: skip (counted in encoder.stats)
                        continue
                    if not isinstance(ids, list):  # a long document's pieces: written as encoded, after the ones before it
                        writers[s].add_batch(encoded, dids, prefix, eos)
                        encoded.clear()
                        dids.clear()
                        write_pieces(writers[s], did, prefix, ids, eos)
                        continue
                    encoded.append(ids)
                    dids.append(did)
                for s, (encoded, dids) in parts.items():
                    writers[s].add_batch(encoded, dids, prefix, eos)
                batch.clear()

            def located_flush():
                try:
                    flush()
                except EncodeError as exc:  # name the file and line of the document the tokenizer failed on
                    did = next(did for did, _, _ in batch if describe_doc(sources, did) == exc.where)
                    record = did & ((1 << RECORD_BITS) - 1)
                    line = locate(sources[did >> RECORD_BITS], d, record)
                    raise exc.relabel(f"{line or sources[did >> RECORD_BITS]} (record {record})") from exc

            for item in tqdm(docs(), desc=f"tokenize shard {shard}", unit=" docs", mininterval=10):
                batch.append(item)
                chars += len(item[2])
                if len(batch) >= BATCH_DOCS or chars >= BATCH_CHARS:
                    located_flush()
                    chars = 0
            if batch:
                located_flush()
            for w in writers.values():
                w.fh.close()
            counts = {s: w.counts() for s, w in writers.items()}
            stats.long.update(encoder.stats if encoder else {})
            meta = {
                "tokenizer_sha256": info.sha256,
                "eos_id": str(info.eos_id),
                "bos_id": str(info.bos_id if bos else -1),
                "vocab_size": str(info.vocab_size),
                "counts": json.dumps(counts),
                "read": json.dumps(stats.as_dict()),
                "encoder": encoder.name if encoder else "none",
                "shard": f"{shard}/{d['num_shards']}",
                "key": shard_key(d, sources_key, info.sha256),
                **{f"sha256.{s}": w.sha.hexdigest() for s, w in writers.items()},
            }
            tensors = {}
            for s, w in writers.items():
                tensors[f"{s}.tokens"] = (dtype, w.path)
                tensors[f"{s}.offsets"] = (np.int64, np.frombuffer(w.offsets, dtype=np.int64))
                tensors[f"{s}.doc_ids"] = (np.int64, np.frombuffer(w.doc_ids, dtype=np.int64))
            stfile.write(tmp, tensors, meta)
        finally:
            for w in writers.values():
                with contextlib.suppress(OSError):  # closing flushes: it fails again on a full disk
                    w.fh.close()
                w.path.unlink(missing_ok=True)
    log.info(
        "shard %d/%d: %s, read %s, encoder %s, bos %s", shard, d["num_shards"], counts, stats.as_dict(), meta["encoder"], bos
    )
    return counts


MAX_AUTO_JOBS = 64  # data.shards_per_job null: at most this many tokenize jobs


def shards_per_job(d: dict) -> int:
    """Shards one tokenize job writes: data.shards_per_job, or enough for at most MAX_AUTO_JOBS jobs."""
    return d.get("shards_per_job") or -(-d["num_shards"] // MAX_AUTO_JOBS)


def job_shards(d: dict, job: int) -> range:
    """The shard indices tokenize job `job` writes (consecutive; the last job may have fewer)."""
    k = shards_per_job(d)
    return range(job * k, min((job + 1) * k, d["num_shards"]))


def num_jobs(d: dict) -> int:
    return -(-d["num_shards"] // shards_per_job(d))


def shard_name(shard: int) -> str:
    return f"shard-{shard:05d}.safetensors"


def _timed_shard(args: tuple) -> tuple[int, float, float, int]:
    """One shard in a worker process: (shard, start, end, pid) for the job's log."""
    start = time.time()
    tokenize_shard(*args)
    return args[2], start, time.time(), os.getpid()


def tokenize_job(cfg: dict, sources_json: str, job: int, tokenizer_dir: str, out_dir: str | Path, threads: int = 1) -> list[Path]:
    """Write the shards of tokenize job `job` into out_dir, `threads` worker processes at a time. Each shard
    is its own atomic file and equal to the one a single-shard job writes, so the store never depends on
    how shards were grouped into jobs."""
    from llmpipe.data.get_data import load_sources, sources_key

    d = cfg["data"]
    shards = job_shards(d, job)
    if not shards:
        raise ValueError(f"tokenize job {job} outside 0..{num_jobs(d) - 1} ({d['num_shards']} shards)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    workers = max(1, min(threads, len(shards)))
    per_worker = max(1, threads // workers)  # encoder threads of each shard
    common = (load_sources(sources_json), sources_key(sources_json), mixture.load(sources_json))
    tasks = [(cfg, common[0], i, tokenizer_dir, out_dir / shard_name(i), per_worker, common[1], common[2]) for i in shards]
    if workers == 1:
        done = map(_timed_shard, tasks)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        done = pool.map(_timed_shard, tasks)
    try:
        for shard, start, end, pid in done:
            log.info("shard %d written by pid %d from %.3f to %.3f", shard, pid, start, end)
    finally:
        if workers > 1:
            pool.shutdown(cancel_futures=True)
    return [t[4] for t in tasks]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe tokenize", description=__doc__)
    p.add_argument("--config", required=True)
    p.add_argument("--sources", required=True, help="sources.json from get-data")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--job", type=int, help="tokenize job index (0-based): writes its data.shards_per_job shards into --out")
    which.add_argument("--shard", type=int, help="one shard (0-based): --out is the .safetensors file")
    p.add_argument("--tokenizer", required=True, help="HF tokenizer folder")
    p.add_argument("--out", required=True, help="the job's folder (--job) or the shard's file (--shard)")
    p.add_argument("--threads", type=int, default=1, help="worker processes (--job) and encoder threads")
    args = p.parse_args(argv)
    cfg = cfgmod.load(args.config)
    try:
        if args.job is not None:
            tokenize_job(cfg, args.sources, args.job, args.tokenizer, args.out, args.threads)
        else:
            from llmpipe.data.get_data import load_sources, sources_key

            src = args.sources
            tokenize_shard(
                cfg, load_sources(src), args.shard, args.tokenizer, args.out, args.threads, sources_key(src), mixture.load(src)
            )
    except (BadRecord, EncodeError) as exc:  # a bad record or source (on_bad_record: fail), a tokenizer failure: one line
        raise SystemExit(f"llmpipe tokenize: error: {exc}") from None
