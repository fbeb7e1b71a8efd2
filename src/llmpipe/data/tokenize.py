"""tokenize (scatter): one shard of the sources -> one token-store shard, streaming.

Output: a safetensors file holding, per split, `<split>.tokens` (every document's ids, BOS first
when the policy says so, EOS last), `<split>.offsets` (document boundaries) and `<split>.doc_ids`
(source index << 40 | record index, or line byte offset in a file cut into byte ranges); metadata:
tokenizer fingerprint, counts, read stats, sha256.
Memory stays flat: tokens go to temporary files as they are made.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import logging
import time
from pathlib import Path

from llmpipe import config as cfgmod
from llmpipe.data import stfile
from llmpipe.data.long_docs import EncodeError
from llmpipe.data.readers import BadRecord, SourceChanged
from llmpipe.data.readers.opener import SourceSizeChanged
from llmpipe.data.shard_set import SPLITS, gc_paused, token_dtype, use_bos  # noqa: F401 (their home before; imported from here)
from llmpipe.io import atomic_path, remove_stale, remove_stale_dirs

log = logging.getLogger(__name__)

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
    """One shard alone (the reference every grouping of shards into jobs writes byte for byte). `mix`:
    the mixture plan of sources.json (data/mixture.py), if the sources are weighted."""
    write(cfg, sources, {shard: Path(out)}, tokenizer_dir, threads, sources_key, mix)
    return json.loads(stfile.header(out)[0]["__metadata__"]["counts"])


def write(cfg: dict, sources: list[str], outs: dict[int, Path], tokenizer_dir, threads: int, sources_key: str, mix) -> None:
    """The shards `outs` ({shard: path}) from one read of the sources (job_reader). A shard whose first
    documents tiktoken encodes unlike HF (tokenizer.backend auto) is written again alone with HF."""
    from llmpipe.data.job_reader import write_shards

    key_of = functools.partial(shard_key, cfg["data"], sources_key)
    with gc_paused():
        redo = write_shards(cfg, sources, outs, tokenizer_dir, threads, key_of, mix)
        if redo:
            hf = {**cfg, "tokenizer": {**cfg["tokenizer"], "backend": "hf"}}
            for shard in redo:
                write_shards(hf, sources, {shard: outs[shard]}, tokenizer_dir, threads, key_of, mix)


MAX_AUTO_JOBS = 64  # data.shards_per_job null, sources at least as many as shards: at most this many jobs


def shards_per_job(d: dict, n_sources: int | None = None) -> int:
    """Shards one tokenize job writes: data.shards_per_job; null: all of them when there are fewer sources
    than shards (every shard reads every source: one job reads each once), else enough for at most
    MAX_AUTO_JOBS jobs and at least data.min_shards_per_job (a profile's threads a job: its processes each
    write whole shards). n_sources None: as many as shards (the DAG passes the count it saw, and num_shards
    for a corpus get-data cuts into byte ranges)."""
    if d.get("shards_per_job"):
        return d["shards_per_job"]
    if n_sources is not None and n_sources < d["num_shards"]:
        return d["num_shards"]
    return min(max(-(-d["num_shards"] // MAX_AUTO_JOBS), d.get("min_shards_per_job") or 1), d["num_shards"])


def job_shards(d: dict, job: int, per_job: int | None = None) -> range:
    """The shard indices tokenize job `job` writes (consecutive; the last job may have fewer)."""
    k = per_job or shards_per_job(d)
    return range(job * k, min((job + 1) * k, d["num_shards"]))


def num_jobs(d: dict, n_sources: int | None = None, per_job: int | None = None) -> int:
    return -(-d["num_shards"] // (per_job or shards_per_job(d, n_sources)))


def shard_name(shard: int) -> str:
    return f"shard-{shard:05d}.safetensors"


def tokenize_job(
    cfg: dict, sources_json: str, job: int, tokenizer_dir: str, out_dir: str | Path, threads: int = 1, per_job: int | None = None
) -> list[Path]:
    """Write the shards of tokenize job `job` into out_dir from one read of the sources, encoded by `threads`
    worker processes (job_reader), or by a pool of `threads` processes each writing whole shards when no two
    shards read the same bytes (shard_pool). Each shard is its own atomic file and equal to the one a single-shard
    job writes, so the store never depends on how shards were grouped into jobs. `per_job`: the DAG's
    grouping (shards_per_job with the source count it saw). Beside the shards: read.json, the bytes
    read from each source (readers.SOURCE_BYTES)."""
    from llmpipe.data.get_data import read_sources
    from llmpipe.data.job_reader import SPOOL
    from llmpipe.data.readers import SOURCE_BYTES, SOURCE_HASHES
    from llmpipe.data.shard_pool import reads_apart, write_apart

    d = cfg["data"]
    shards = job_shards(d, job, per_job)
    if not shards:
        raise ValueError(f"tokenize job {job} outside 0..{num_jobs(d, per_job=per_job) - 1} ({d['num_shards']} shards)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    outs = {i: out_dir / shard_name(i) for i in shards}
    (out_dir / READ_FILE).unlink(missing_ok=True)  # the job's mark of completion: gone until this run ends
    for path in outs.values():  # what killed runs left: temp shards and spool folders
        remove_stale(path)
    remove_stale_dirs(out_dir, SPOOL)
    start = time.time()
    SOURCE_BYTES.clear()
    SOURCE_HASHES.clear()
    sources, manifest = read_sources(sources_json, d)
    key, mix = manifest["key"], manifest.get("mixture")
    if threads > 1 and len(outs) > 1 and reads_apart(sources, d["num_shards"], outs):  # no read to share
        sums = write_apart(write_checked, cfg, sources, manifest["sources"], outs, tokenizer_dir, threads, key, mix)
    else:
        sums = write_checked(cfg, sources, manifest["sources"], outs, tokenizer_dir, threads, key, mix)
    with atomic_path(out_dir / READ_FILE) as tmp:
        tmp.write_text(json.dumps({"bytes_read": dict(SOURCE_BYTES), "sha256": sums}, indent=1))
    log.info(
        "job %d: %d shards in %.1f s, %d threads, read %s", job, len(shards), time.time() - start, threads, dict(SOURCE_BYTES)
    )
    return list(outs.values())


def write_checked(cfg: dict, sources: list[str], entries: list[dict], outs: dict[int, Path], tokenizer_dir, threads, key, mix):
    """write, then the checksums of what it read (checked_sources)."""
    write(cfg, sources, outs, tokenizer_dir, threads, key, mix)
    return checked_sources(cfg["data"], sources, entries, outs)


READ_FILE = "read.json"  # a tokenize job's source bytes read and the sha256 of what it read


def checked_sources(d: dict, sources: list[str], entries: list[dict], outs: dict[int, Path]) -> list[list]:
    """source_checksums of the shards `outs` just written; a source whose size changed since get-data
    (SourceSizeChanged) takes those shards away before the error goes on: none stays looking complete."""
    from llmpipe.data.readers.opener import SourceSizeChanged

    try:
        return source_checksums(d, sources, entries, sorted(outs))
    except SourceSizeChanged:
        for path in outs.values():
            path.unlink(missing_ok=True)
        raise


def source_checksums(d: dict, sources: list[str], entries: list[dict], shards) -> list[list]:
    """[source index, start, end, sha256] of each local source, or byte range of one, that `shards` read:
    hashed as the readers read it, the rest read now (readers.SOURCE_HASHES.digest). A source that cannot
    be read (skipped under on_bad_record: skip) gets None."""
    from llmpipe.data.readers import SOURCE_HASHES
    from llmpipe.data.sources import assign

    spans = set()
    for shard in shards:
        plan = assign(sources, d["num_shards"], shard)
        ranged = {i: r for i, r in plan.ranges}
        for i, source in plan.sources:
            e = entries[i]
            if "unusable" in e or e.get("size") is None or "://" in source and not source.startswith("file://"):
                continue
            spans.add((i, ranged[i].start, ranged[i].end) if i in ranged else (i, 0, e["size"]))
    out = []
    for i, a, b in sorted(spans):
        try:
            SOURCE_HASHES.check_size(entries[i]["source"], entries[i]["size"])
            out.append([i, a, b, SOURCE_HASHES.digest(entries[i]["source"], a, b)])
        except OSError as exc:
            log.warning("data source %s: no sha256 (%s)", entries[i]["source"], exc)
            out.append([i, a, b, None])
    return out


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
    p.add_argument(
        "--shards-per-job", type=int, help="--job: the DAG's grouping (default: data.shards_per_job as if sources >= shards)"
    )
    args = p.parse_args(argv)
    cfg = cfgmod.load(args.config)
    try:
        if args.job is not None:
            tokenize_job(cfg, args.sources, args.job, args.tokenizer, args.out, args.threads, args.shards_per_job)
        else:
            from llmpipe.data.get_data import read_sources
            from llmpipe.data.readers import SOURCE_HASHES

            SOURCE_HASHES.clear()
            sources, manifest = read_sources(args.sources, cfg["data"])
            tokenize_shard(
                cfg, sources, args.shard, args.tokenizer, args.out, args.threads, manifest["key"], manifest.get("mixture")
            )
            checked_sources(cfg["data"], sources, manifest["sources"], {args.shard: Path(args.out)})
    except (
        BadRecord,
        EncodeError,
        SourceChanged,
        SourceSizeChanged,
        ValueError,
    ) as exc:  # a bad record or source, a tokenizer failure, another config's sources.json: one line
        raise SystemExit(f"llmpipe tokenize: error: {exc}") from None
