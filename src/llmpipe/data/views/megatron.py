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
from llmpipe.data.views.litgpt import file_dtype  # the same rule: uint16 under 65,500 tokens, else int32
from llmpipe.io import WriteOnce

MAGIC, VERSION = b"MMIDIDX\x00\x00", 1
CODES = {np.dtype(np.int32): 4, np.dtype(np.uint16): 8}  # Megatron's DType codes of the two we write
HEAD = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, documents
COPY_TOKENS = 1 << 24  # tokens copied per read


def write_split(store: TokenStore, split: str, prefix: Path) -> dict:
    dtype = file_dtype(store.manifest["tokenizer"]["vocab_size"]).newbyteorder("<")
    docs, tokens = (store.manifest["totals"][split][k] for k in ("documents", "tokens"))
    if not docs:  # Megatron's IndexedDataset cannot map an empty .bin
        raise ValueError(f"{split} split has no documents: nothing for Megatron to read (data.val_fraction, more data)")
    with WriteOnce(prefix.with_suffix(".bin")) as bin_fh, open(prefix.with_suffix(".idx"), "wb") as idx:
        idx.write(HEAD.pack(MAGIC, VERSION, CODES[dtype.newbyteorder("=")], docs, docs + 1))
        at_len, at_ptr, done = HEAD.size, HEAD.size + 4 * docs, 0  # where the next lengths / pointers go
        for e in store.manifest["shards"]:
            with safe_open(str(store.root / e["file"]), framework="numpy") as f:
                toks = f.get_slice(f"{split}.tokens")
                n = toks.get_shape()[0]
                for a in range(0, n, COPY_TOKENS):
                    bin_fh.write(toks[a : min(n, a + COPY_TOKENS)].astype(dtype).tobytes())
                offsets = f.get_tensor(f"{split}.offsets")  # [0, end of doc 1, ...] within this shard
            idx.seek(at_len)
            at_len += idx.write(np.diff(offsets).astype("<i4").tobytes())
            idx.seek(at_ptr)
            at_ptr += idx.write(((offsets[:-1] + done) * dtype.itemsize).astype("<i8").tobytes())
            done += n
        idx.seek(at_ptr)
        idx.write(np.arange(docs + 1, dtype="<i8").tobytes())
    if done != tokens:
        raise ValueError(f"{split}: the shards hold {done} tokens, the manifest says {tokens}")
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
