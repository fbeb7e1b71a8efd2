"""Packing: cut a token stream into fixed-length rows under an explicit remainder policy.

Row i (in stream order) holds stream[i*L:(i+1)*L]. The last partial row is
  drop  -> left out (its tokens counted as dropped),
  pad   -> filled with pad_id (attention_mask 0, label IGNORE_INDEX),
  carry -> completed with the first tokens of the stream (wrapped; counted), so no token is lost
           and every position is real.
Rows can then be served in a seeded permutation; `segment_ids` number the documents inside a row
(0, 1, ...; -1 on padding) so attention can be limited to one document.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

IGNORE_INDEX = -100
POLICIES = ("drop", "pad", "carry")


@dataclass(frozen=True)
class Layout:
    size: int  # stream tokens
    row_len: int
    remainder: str

    def __post_init__(self):
        if self.remainder not in POLICIES:
            raise ValueError(f"unknown remainder policy {self.remainder!r} ({' | '.join(POLICIES)})")
        if self.remainder == "carry" and 0 < self.size < self.row_len:
            raise ValueError(f"remainder 'carry' needs at least one full row ({self.size} < {self.row_len} tokens)")

    @property
    def full(self) -> int:
        return self.size // self.row_len

    @property
    def rest(self) -> int:
        return self.size % self.row_len

    @property
    def rows(self) -> int:
        return self.full + (1 if self.rest and self.remainder != "drop" else 0)

    def stats(self) -> dict:
        partial = self.rest if self.rows > self.full else 0
        return {
            "remainder": self.remainder,
            "tokens_in": self.size,
            "rows": self.rows,
            "tokens_packed": self.full * self.row_len + partial,
            "dropped_tokens": self.rest if self.remainder == "drop" else 0,
            "padded_tokens": self.row_len - self.rest if self.remainder == "pad" and self.rest else 0,
            "wrapped_tokens": self.row_len - self.rest if self.remainder == "carry" and self.rest else 0,
        }

    def spans(self, i: int) -> list[tuple[int, int]]:
        """Stream ranges making row i, in order (a wrapped last row has two)."""
        a = i * self.row_len
        if i < self.full:
            return [(a, a + self.row_len)]
        if i != self.full or i >= self.rows:
            raise IndexError(f"row {i} outside 0..{self.rows - 1}")
        return [(a, self.size)] + ([(0, self.row_len - self.rest)] if self.remainder == "carry" else [])


def order(rows: int, shuffle: bool, seed: int) -> np.ndarray:
    """Row serving order: seeded permutation, or stream order."""
    return np.random.default_rng(seed).permutation(rows) if shuffle else np.arange(rows)


def row(read, layout: Layout, i: int, pad_id: int, doc_starts: np.ndarray | None = None):
    """(input_ids, attention_mask, segment_ids or None) of row i; `read(a, b)` gives stream tokens."""
    spans = layout.spans(i)
    ids = np.concatenate([read(a, b) for a, b in spans])
    real = ids.size
    mask = np.ones(layout.row_len, np.int8)
    if real < layout.row_len:
        ids = np.concatenate([ids, np.full(layout.row_len - real, pad_id, np.int64)])
        mask[real:] = 0
    segs = None
    if doc_starts is not None:
        pos = np.concatenate([np.arange(a, b) for a, b in spans])
        doc = doc_starts.searchsorted(pos, side="right") - 1
        doc[spans[0][1] - spans[0][0] :] += doc_starts.size  # a wrapped part holds later documents
        segs = np.full(layout.row_len, -1, np.int32)
        segs[:real] = np.unique(doc, return_inverse=True)[1]  # 0, 1, 2, ... in row order
    return ids, mask, segs


def rows(
    read,
    layout: Layout,
    idx: np.ndarray,
    pad_id: int,
    doc_starts: np.ndarray | None = None,
    dtype=np.int64,
    seg_dtype=np.int32,
    gather=None,
):
    """row() of each index in `idx`, stacked: ([n, L] ids as `dtype`, [n, L] int8 mask, [n, L] segment ids
    as `seg_dtype` or None). Full rows take few numpy calls: `gather(full row indices, L, out)` copies their
    tokens (SplitStream.full_rows; None: read() a row at a time), each row's segments are cut at the document
    starts inside it and written in one np.repeat; the last, partial row goes through row(). The mask of
    a batch of full rows is one shared read-only array of ones."""
    idx = np.asarray(idx, dtype=np.int64)
    n, L = idx.size, layout.row_len
    full = idx < layout.full
    at = np.flatnonzero(full)
    ids = np.empty((n, L), dtype)
    mask = _ones(n, L) if at.size == n else np.ones((n, L), np.int8)
    segs = None
    if gather is None:
        for j in at.tolist():
            ids[j] = read(int(idx[j]) * L, (int(idx[j]) + 1) * L)
    elif at.size == n:
        gather(idx, L, ids)
    elif at.size:
        part = np.empty((at.size, L), dtype)
        gather(idx[at], L, part)
        ids[at] = part
    if doc_starts is not None:
        segs = np.empty((n, L), seg_dtype)
        a = idx[at] * L
        lo = doc_starts.searchsorted(a, side="right")  # the start at a itself opens segment 0
        count = doc_starts.searchsorted(a + L, side="left") - lo  # starts inside each row
        k = count + 1  # segments in each row
        first = np.cumsum(k) - k  # each row's first segment, in the flat list of segments
        begin = np.zeros(int(k.sum()), np.int64)  # each segment's first position in its row
        later = np.ones(begin.size, bool)
        later[first] = False
        inside = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count - lo, count)  # into doc_starts
        begin[later] = doc_starts[inside] - np.repeat(a, count)
        end = np.append(begin[1:], L)
        end[first - 1] = L  # a row's last segment ends at L (first[0] - 1 is the very last)
        local = np.arange(begin.size) - np.repeat(first, k)  # 0, 1, 2, ... in each row
        segs[at] = np.repeat(local.astype(seg_dtype), end - begin).reshape(at.size, L)
    for j in np.flatnonzero(~full).tolist():
        r_ids, mask[j], r_segs = row(read, layout, int(idx[j]), pad_id, doc_starts)
        ids[j] = r_ids
        if segs is not None:
            segs[j] = r_segs
    return ids, mask, segs


@functools.lru_cache(maxsize=4)
def _ones(n: int, length: int) -> np.ndarray:
    ones = np.ones((n, length), np.int8)
    ones.flags.writeable = False
    return ones


def labels_of(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.where(mask == 1, ids, IGNORE_INDEX)


@dataclass
class Packed:
    input_ids: np.ndarray  # [rows, seq_len]
    attention_mask: np.ndarray  # [rows, seq_len], 0 on padding
    labels: np.ndarray  # [rows, seq_len], IGNORE_INDEX on padding
    stats: dict


def pack(stream: np.ndarray, seq_len: int, remainder: str, pad_id: int) -> Packed:
    """All rows of an in-memory stream, in stream order."""
    layout = Layout(int(stream.size), seq_len, remainder)
    stream = np.asarray(stream, dtype=np.int64)
    rows = [row(lambda a, b: stream[a:b], layout, i, pad_id) for i in range(layout.rows)]
    ids = np.stack([r[0] for r in rows]) if rows else np.zeros((0, seq_len), np.int64)
    mask = np.stack([r[1] for r in rows]) if rows else np.zeros((0, seq_len), np.int8)
    return Packed(ids, mask, labels_of(ids, mask), layout.stats())
