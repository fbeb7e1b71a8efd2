"""Sizes and switches of the readers, read at call time as limits.NAME (so tests can set them smaller)."""

from __future__ import annotations

LINE_CHUNK = 1 << 20  # bytes read at a time by huge._lines
HUGE_RECORD_BYTES = 16 << 20  # a line or text file longer than this is not held (huge.py)
HUGE_CHUNK = 1 << 20  # bytes read at a time from such a record
LONG_STRING = 1 << 20  # characters: a JSON string longer than this in a huge record is streamed, not held
SMALL_PIECE = 8 << 10  # bytes decoded at a time where the text is only checked, scanned or spooled
# Internal switch: False reads every record line one by one even when a shard keeps only its own records
# (the reference path the byte-identity test compares the strided scan with).
STRIDED_SCAN = True
STRIDE_BLOCK = 1 << 21  # bytes read at a time by the strided scan
STRIDE_MIN = 4  # below 4 shards per record-level source, reading each line is as fast
PARQUET_BATCH = 256  # rows decoded at a time
