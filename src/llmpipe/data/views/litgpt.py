"""lit-gpt PackedDataset view (the SageMaker marketplace algorithm's input).

Each file: 7-byte magic `LITPKDS`, uint64 LE version 1, uint8 dtype code, uint64 LE chunk_size, then
chunk_size tokens; chunk_size = (seq_len + 1) x the split's blocks per file (blocks_per_file: at most
data.litgpt_sequences_per_file); dtype uint16 (code 8) when the vocabulary has fewer than 65,500
entries, else int32 (code 4); the last file is padded with the pad token (EOS: lit-gpt reads padding as
data, and the pad remainder's filler too: the format has no mask), under one block per file. Files: train/train_<name>_0_<counter:010d>.bin and
validation/validation_<name>_0_<counter:010d>.bin.
"""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import numpy as np
from tqdm import tqdm

from llmpipe.data.pack import Layout, order, row
from llmpipe.data.token_store import TokenStore
from llmpipe.io import WriteOnce

log = logging.getLogger(__name__)

MAGIC, VERSION = b"LITPKDS", 1
CODES = {
    np.dtype(np.uint8): 1,
    np.dtype(np.int8): 2,
    np.dtype(np.int16): 3,
    np.dtype(np.int32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.float32): 6,
    np.dtype(np.float64): 7,
    np.dtype(np.uint16): 8,
}
HEADER = struct.Struct("<7sQBQ")  # 24 bytes


def file_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size < 65500 else np.dtype(np.int32)


def blocks_per_file(rows: int, most: int) -> int:
    """Blocks in every file of a split (lit-gpt takes one chunk size, from the first file): the fewest files
    of at most `most` blocks, sharing the rows evenly, so the last file's padding is under one block per
    file (1024 a file for 111 rows padded 913 all-EOS blocks, served as data)."""
    return -(-rows // -(-rows // most))


def read_file(path: str | Path) -> np.ndarray:
    """Tokens of one PackedDataset file, checked against its header."""
    raw = Path(path).read_bytes()
    magic, version, code, chunk = HEADER.unpack_from(raw)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"{path}: not a lit-gpt PackedDataset file")
    dtype = {v: k for k, v in CODES.items()}[code]
    tokens = np.frombuffer(raw, dtype=dtype.newbyteorder("<"), offset=HEADER.size)
    if tokens.size != chunk:
        raise ValueError(f"{path}: header says {chunk} tokens, file holds {tokens.size}")
    return tokens


def write_split(
    store: TokenStore,
    split: str,
    out: Path,
    prefix: str,
    name: str,
    seq_len: int,
    per_file: int,
    remainder: str,
    shuffle: bool,
    seed: int,
) -> dict:
    stream = store.split(split)
    block = seq_len + 1
    layout = Layout(stream.size, block, remainder)
    if layout.rows == 0:
        raise ValueError(f"{split} split has {stream.size} tokens: not one block of {block}")
    dtype = file_dtype(store.manifest["tokenizer"]["vocab_size"])
    per_file = blocks_per_file(layout.rows, per_file)
    perm = order(layout.rows, shuffle, seed)
    out.mkdir(parents=True)
    files = 0
    batches = range(0, layout.rows, per_file)
    for counter, k in enumerate(tqdm(batches, desc=f"pack litgpt/{split}", unit=" files", mininterval=10)):
        chunk = np.full(block * per_file, store.eos_id, dtype=np.int64)
        for j, i in enumerate(perm[k : k + per_file]):
            chunk[j * block : (j + 1) * block] = row(stream.read, layout, int(i), store.eos_id)[0]
        with WriteOnce(out / f"{prefix}_{name}_0_{counter:010d}.bin") as fh:
            fh.write(HEADER.pack(MAGIC, VERSION, CODES[dtype], chunk.size))
            fh.write(chunk.astype(dtype.newbyteorder("<")).tobytes())
        files += 1
    return {
        **layout.stats(),
        "block": block,
        "files": files,
        "sequences_per_file": per_file,
        "file_pad_tokens": (files * per_file - layout.rows) * block,
        "dtype": dtype.name,
        "shuffle": shuffle,
        "seed": seed,
    }


def write(store: TokenStore, out: Path, cfg: dict) -> dict:
    d, seq_len, per = cfg["data"], cfg["train"]["seq_len"], cfg["data"]["litgpt_sequences_per_file"]
    return {
        "train": write_split(
            store, "train", out / "train", "train", cfg["run"], seq_len, per, d["remainder"], d["shuffle"], d["shuffle_seed"]
        ),
        "val": write_split(
            store, "val", out / "validation", "validation", cfg["run"], seq_len, per, d["val_remainder"], False, d["shuffle_seed"]
        ),
    }
