"""Parquet: row groups read page by page, the footer read exactly."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from llmpipe.data.readers import limits
from llmpipe.data.readers.opener import _open_raw
from llmpipe.data.readers.stats import BadRecord, BadSource


def _parquet_file(fh):
    """A ParquetFile over a binary file object, read in bounded memory: each column chunk streamed in
    HUGE_CHUNK pieces, not pre-buffered (pyarrow's default pre_buffer kept the column chunks read from a
    Python file object: peak RSS grew with the file, +56 MB at 100 MB of text)."""
    import pyarrow.parquet as pq

    meta = _parquet_footer(fh)
    fh.read_through = meta is not None  # other columns' bytes are read too, not skipped: one read of each byte, hashed
    return pq.ParquetFile(fh, metadata=meta, pre_buffer=False, buffer_size=limits.HUGE_CHUNK)


def _parquet_footer(fh):
    """The file's metadata, read exactly (the footer and its length, then its leading magic, so the magic and
    the row groups after it are one run of reads, hashed in order: opener._Hashes): pyarrow's own open reads
    the last 64 KiB, then the column chunks there again. None: not a well-formed file (pyarrow then opens it
    and names what is wrong)."""
    import io

    import pyarrow.parquet as pq

    size = fh.seek(0, 2)
    if size < 12:
        return None
    fh.seek(size - 8)
    tail = fh.read(8)
    n = int.from_bytes(tail[:4], "little")
    if tail[4:] != b"PAR1" or n + 12 > size:
        return None
    fh.seek(size - 8 - n)
    footer = fh.read_kept(n) if hasattr(fh, "read_kept") else fh.read(n)
    fh.footer_at = size - 8 - n
    fh.seek(0)
    if fh.read(4) != b"PAR1":
        return None
    return pq.read_metadata(io.BytesIO(b"PAR1" + footer + tail))  # the file now stands at its first column chunk


def _parquet_values(pf, column: str) -> Iterator[object]:
    """The values of one column, PARQUET_BATCH rows decoded at a time."""
    return _arrow_values(pf.iter_batches(columns=[column], batch_size=limits.PARQUET_BATCH, use_threads=False), column)


def _arrow_values(batches, column: str) -> Iterator[object]:
    """The values of `column` in each Arrow record batch (_MISSING for each row of a batch without it), made
    Python objects PARQUET_BATCH at a time. Arrow's unused memory is handed back after each batch: its
    allocator (mimalloc) otherwise kept ~25 MB more at peak (benchmarks/stream_memory.py, parquet)."""
    import pyarrow as pa

    pool = pa.default_memory_pool()
    for batch in batches:
        if column not in batch.schema.names:
            yield from itertools.repeat(_MISSING, batch.num_rows)
            continue
        values = batch.column(column)
        del batch
        for at in range(0, len(values), limits.PARQUET_BATCH):
            part = values.slice(at, limits.PARQUET_BATCH)
            try:
                yield from part.to_pylist()
            except UnicodeDecodeError:  # a string column holding invalid UTF-8 (Arrow does not check on read)
                yield from map(_as_py, part)
        del values
        pool.release_unused()


def _as_py(value) -> object:
    try:
        return value.as_py()
    except UnicodeDecodeError as exc:
        return InvalidUtf8(exc.start)


class InvalidUtf8:
    """A text value that is not UTF-8 (a bad record: the reader names it and where)."""

    def __init__(self, start: int):
        self.start = start

    def bad(self, where: str) -> BadRecord:
        return BadRecord("invalid_utf8", where, f"invalid UTF-8 at byte {self.start}")


def _parquet(url: str, text_field: str) -> Iterator[tuple[str, object]]:
    with _open_raw(url) as fh:
        pf = _parquet_file(fh)
        if text_field not in pf.schema_arrow.names:
            raise BadSource("missing_field", url, f"no '{text_field}' column (columns: {', '.join(pf.schema_arrow.names)})")
        for row, value in enumerate(_parquet_values(pf, text_field)):
            where = f"{url}:row {row}"
            yield where, value.bad(where) if isinstance(value, InvalidUtf8) else value
        read_rest(fh)


def read_rest(fh) -> None:
    """Read on to the footer (read first): the column chunks after the text column's last one, so that every
    byte is read once, in order (fh.read_through), and the checksum needs no second read."""
    if getattr(fh, "read_through", False):
        fh.seek(fh.footer_at)


_MISSING = object()  # a record without the text field
