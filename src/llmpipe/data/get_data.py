"""get_data: read the corpus once, split train/val by document, write N Parquet shards (round-robin)."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from llmpipe import config as cfgmod
from llmpipe.data.readers import ReadStats, iter_documents
from llmpipe.io import atomic_path, write_json

log = logging.getLogger(__name__)

SCHEMA = pa.schema([("doc_id", pa.int64()), ("split", pa.string()), ("text", pa.large_string())])
BATCH = 2048


def is_validation(doc_id: int, fraction: float, seed: int) -> bool:
    """Seeded hash of the document index: stable whatever the shard count or reading order."""
    digest = hashlib.blake2b(f"{seed}:{doc_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < fraction


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def get_data(data_cfg: dict, out_dir: str | Path) -> dict:
    out_dir = Path(out_dir)
    n = data_cfg["num_shards"]
    stats = ReadStats()
    counts = [{"train": 0, "val": 0} for _ in range(n)]
    buffers: list[list[tuple[int, str, str]]] = [[] for _ in range(n)]
    targets = [out_dir / f"{shard_name(i)}.parquet" for i in range(n)]
    with contextlib.ExitStack() as stack:
        tmps = [stack.enter_context(atomic_path(t)) for t in targets]
        writers = [pq.ParquetWriter(t, SCHEMA, compression="zstd") for t in tmps]

        def flush(i: int) -> None:
            if buffers[i]:
                ids, splits, texts = zip(*buffers[i])
                writers[i].write_table(pa.table([list(ids), list(splits), list(texts)], schema=SCHEMA))
                buffers[i].clear()

        for doc_id, text in enumerate(iter_documents(data_cfg, stats)):
            split = "val" if is_validation(doc_id, data_cfg["val_fraction"], data_cfg["split_seed"]) else "train"
            shard = doc_id % n
            buffers[shard].append((doc_id, split, text))
            counts[shard][split] += 1
            if len(buffers[shard]) >= BATCH:
                flush(shard)
        for i in range(n):
            flush(i)
            writers[i].close()
        total = {s: sum(c[s] for c in counts) for s in ("train", "val")}
        if total["train"] == 0 or total["val"] == 0:
            raise ValueError(
                f"split gave {total['train']} train and {total['val']} validation documents out of "
                f"{stats.documents}: need at least one of each (check data.sources / data.val_fraction)"
            )
    manifest = {
        "sources": data_cfg["sources"],
        "read": stats.as_dict(),
        "documents": total,
        "shards": [{"file": t.name, **c} for t, c in zip(targets, counts)],
    }
    write_json(out_dir / "manifest.json", manifest)
    log.info("read %d documents (%s skipped: %s) -> %d shards, train %d / val %d",
             stats.documents, sum(stats.skipped.values()), dict(stats.skipped), n, total["train"], total["val"])
    return manifest


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe get-data", description=__doc__)
    p.add_argument("--config", required=True, help="config YAML/JSON file or inline JSON")
    p.add_argument("--out", required=True, help="folder for shard-XXXXX.parquet + manifest.json")
    args = p.parse_args(argv)
    get_data(cfgmod.load(args.config)["data"], args.out)
