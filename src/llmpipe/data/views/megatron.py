"""Megatron-LM / NeMo indexed dataset view: <split>_text_document.bin + .idx per split.

One sequence per document, tokens as stored (BOS/EOS per the data policy), in store order: Megatron
packs, shuffles and blends by itself, so the packing settings do not apply. .bin: the tokens, little
endian, uint16 when the vocabulary has fewer than 65,500 entries, else int32 (Megatron's choice).
.idx (MMIDIDX version 1): b"MMIDIDX\\x00\\x00", uint64 1, uint8 dtype code, uint64 sequence count,
uint64 document count (documents + 1), int32 sequence lengths, int64 byte offsets into .bin, int64
document indices 0..n. Written shard by shard: memory is bounded by the largest shard.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
from safetensors import safe_open

from llmpipe.data.token_store import SPLITS, TokenStore

MAGIC, VERSION = b"MMIDIDX\x00\x00", 1
CODES = {np.dtype(np.uint8): 1, np.dtype(np.int8): 2, np.dtype(np.int16): 3, np.dtype(np.int32): 4,
         np.dtype(np.int64): 5, np.dtype(np.float64): 6, np.dtype(np.float32): 7, np.dtype(np.uint16): 8}
HEAD = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, documents
COPY_TOKENS = 1 << 24  # tokens copied per read


def file_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size < 65500 else np.dtype(np.int32)


def _shard_lengths(files: list[safe_open], split: str):
    for f in files:
        yield np.diff(f.get_tensor(f"{split}.offsets"))


def write_split(store: TokenStore, split: str, prefix: Path) -> dict:
    dtype = file_dtype(store.manifest["tokenizer"]["vocab_size"]).newbyteorder("<")
    files = [safe_open(str(store.root / e["file"]), framework="numpy") for e in store.manifest["shards"]]
    docs = sum(f.get_slice(f"{split}.doc_ids").get_shape()[0] for f in files)
    tokens = 0
    with open(prefix.with_suffix(".bin"), "wb") as fh:
        for f in files:
            toks = f.get_slice(f"{split}.tokens")
            n = toks.get_shape()[0]
            for a in range(0, n, COPY_TOKENS):
                fh.write(toks[a:min(n, a + COPY_TOKENS)].astype(dtype).tobytes())
            tokens += n
    with open(prefix.with_suffix(".idx"), "wb") as fh:
        fh.write(HEAD.pack(MAGIC, VERSION, CODES[dtype.newbyteorder("=")], docs, docs + 1))
        for lengths in _shard_lengths(files, split):
            fh.write(lengths.astype("<i4").tobytes())
        start = 0
        for lengths in _shard_lengths(files, split):
            ends = np.cumsum(lengths) + start
            fh.write(((ends - lengths) * dtype.itemsize).astype("<i8").tobytes())
            start = int(ends[-1]) if ends.size else start
        fh.write(np.arange(docs + 1, dtype="<i8").tobytes())
    return {"documents": docs, "tokens": tokens, "dtype": dtype.name, "prefix": prefix.name}


def read(prefix: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, per-document lengths) of one .bin/.idx pair, checked against the index header."""
    prefix = Path(prefix)
    raw = prefix.with_suffix(".idx").read_bytes()
    magic, version, code, seqs, docs = HEAD.unpack_from(raw)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"{prefix}.idx: not a Megatron MMIDIDX index")
    dtype = {v: k for k, v in CODES.items()}[code].newbyteorder("<")
    lengths = np.frombuffer(raw, "<i4", seqs, HEAD.size)
    pointers = np.frombuffer(raw, "<i8", seqs, HEAD.size + 4 * seqs)
    doc_index = np.frombuffer(raw, "<i8", docs, HEAD.size + 12 * seqs)
    if len(raw) != HEAD.size + 12 * seqs + 8 * docs or not np.array_equal(doc_index, np.arange(docs)):
        raise ValueError(f"{prefix}.idx: size or document index does not match its header")
    tokens = np.fromfile(prefix.with_suffix(".bin"), dtype)
    starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)[:-1]]) * dtype.itemsize
    if tokens.size != lengths.sum() or not np.array_equal(pointers, starts[:seqs]):
        raise ValueError(f"{prefix}: .bin size or byte offsets do not match the index")
    return tokens, lengths


def write(store: TokenStore, out: Path, cfg: dict) -> dict:
    out.mkdir(parents=True)
    return {split: write_split(store, split, out / f"{split}_text_document") for split in SPLITS}
