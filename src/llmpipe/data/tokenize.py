"""tokenize (scatter): one raw shard -> one token-store shard (safetensors: ids, doc offsets, doc ids)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from safetensors.numpy import save_file

from llmpipe import config as cfgmod
from llmpipe.data.tokenizer import load_tokenizer, tokenizer_info
from llmpipe.io import atomic_path

log = logging.getLogger(__name__)

SPLITS = ("train", "val")


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def use_bos(policy: str, adds_bos: bool) -> bool:
    return policy == "always" or (policy == "auto" and adds_bos)


def tokenize_shard(shard: str | Path, tokenizer_dir: str | Path, out: str | Path, add_bos: str = "auto") -> dict:
    tok = load_tokenizer(tokenizer_dir)
    info = tokenizer_info(tokenizer_dir, tok)
    bos = use_bos(add_bos, info.adds_bos)
    if bos and info.bos_id is None:
        raise ValueError(f"data.add_bos is 'always' but tokenizer {tokenizer_dir} has no bos_token")
    dtype = token_dtype(info.vocab_size)
    backend = tok.backend_tokenizer
    prefix = [info.bos_id] if bos else []
    parts = {s: {"tokens": [], "lengths": [], "doc_ids": []} for s in SPLITS}
    for batch in pq.ParquetFile(shard).iter_batches(batch_size=1024):
        rows = batch.to_pydict()
        encodings = backend.encode_batch(rows["text"], add_special_tokens=False)
        for doc_id, split, enc in zip(rows["doc_id"], rows["split"], encodings):
            ids = prefix + enc.ids + [info.eos_id]
            part = parts[split]
            part["tokens"].append(np.asarray(ids, dtype=dtype))
            part["lengths"].append(len(ids))
            part["doc_ids"].append(doc_id)
    tensors, counts = {}, {}
    for split, part in parts.items():
        lengths = np.asarray(part["lengths"], dtype=np.int64)
        tensors[f"{split}.tokens"] = np.concatenate(part["tokens"]) if part["tokens"] else np.zeros(0, dtype)
        tensors[f"{split}.offsets"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        tensors[f"{split}.doc_ids"] = np.asarray(part["doc_ids"], dtype=np.int64)
        counts[split] = {"documents": int(lengths.size), "tokens": int(lengths.sum())}
    meta = {
        "tokenizer_sha256": info.sha256,
        "eos_id": str(info.eos_id),
        "bos_id": str(info.bos_id if bos else -1),
        "vocab_size": str(info.vocab_size),
        "counts": json.dumps(counts),
    }
    with atomic_path(out) as tmp:
        save_file(tensors, str(tmp), metadata=meta)
    log.info("%s: %s (bos=%s, dtype=%s)", shard, counts, bos, dtype)
    return counts


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe tokenize", description=__doc__)
    p.add_argument("--config", required=True)
    p.add_argument("--shard", required=True, help="raw Parquet shard from get-data")
    p.add_argument("--tokenizer", required=True, help="HF tokenizer folder")
    p.add_argument("--out", required=True, help="token shard (.safetensors)")
    args = p.parse_args(argv)
    tokenize_shard(args.shard, args.tokenizer, args.out, cfgmod.load(args.config)["data"]["add_bos"])
