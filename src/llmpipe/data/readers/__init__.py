"""Read documents from one source: a local path or fsspec URL (JSONL[.gz|.zst], Parquet, text) or a
Hugging Face dataset ("hf:<id or local folder>"), under an explicit bad-record policy.

One module per input kind (jsonl, parquet, text, hf), opening and counting in raw, huge records in
huge, what reading found in stats, sizes in limits; records() picks the kind, documents() is the entry point."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

from llmpipe.data.readers.hf import _hf
from llmpipe.data.readers.huge import StreamedText
from llmpipe.data.readers.jsonl import SourceChanged, Where, _jsonl
from llmpipe.data.readers.opener import SOURCE_BYTES, SOURCE_HASHES, _base_name, _compression
from llmpipe.data.readers.parquet import _parquet
from llmpipe.data.readers.stats import BadRecord, BadSource, ReadStats, broken, is_read_error
from llmpipe.data.readers.text import _text
from llmpipe.data.sources import HF_PREFIX, expand_sources, paths

log = logging.getLogger(__name__)

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")

TEXT_SUFFIXES = (".txt",)


def records(source: str, cfg: dict, keep=None, stride=None, part=None, tally=None) -> Iterator[tuple[str | None, object]]:
    """(location, text or BadRecord) for every record of one source, in order; records whose index
    `keep` rejects may come unread, as (None, how many in a row). stride, part, tally: see _jsonl."""
    if part is not None and (_compression(source) or not _base_name(source).endswith(JSONL_SUFFIXES)):
        raise ValueError(f"{source}: only a plain JSONL file is read by byte range")
    kind = source_format(source)
    if kind == "hf":
        return _hf(source, cfg)
    if kind == "jsonl":
        return _jsonl(source, cfg["text_field"], keep, stride, part, tally)
    if kind == "parquet":
        return _parquet(source, cfg["text_field"])
    if kind == "text":
        return _text(source, cfg["text_mode"])
    path = source.removeprefix("file://")
    if "://" not in path and os.path.isdir(path):  # kept by get-data under on_bad_record: skip, to be counted
        raise BadSource("unreadable_source", source, "is a directory, not a file")
    raise ValueError(unsupported(source))


def source_format(source: str) -> str | None:
    """hf | jsonl | parquet | text, from the name (a URL's path; compression suffixes aside); None: none we read."""
    if source.startswith(HF_PREFIX):
        return "hf"
    name = _base_name(source)
    for kind, suffixes in (("jsonl", JSONL_SUFFIXES), ("parquet", (".parquet",)), ("text", TEXT_SUFFIXES)):
        if name.endswith(suffixes):
            return kind
    return None


def unsupported(source: str) -> str:
    return f"unsupported data source format: {source} (expected .jsonl/.json[.gz|.zst], .parquet, .txt[.gz|.zst] or hf:<id>)"


def locate(source: str, cfg: dict, record_index: int) -> str | None:
    """Where record `record_index` of `source` is (`file:line` for JSONL), by reading it again (error paths only);
    in a file cut into byte ranges the index is the line's byte offset (`file:byte N`)."""
    if getattr(source, "ranges", None):
        return Where.at(source, record_index)
    index = 0
    for where, value in records(source, cfg):
        if where is None:  # records passed over unread
            index += value
            continue
        if index == record_index:
            return where
        index += 1
    return None


def check(where: str, value: object, cfg: dict) -> str | BadRecord:
    """The document text, or why it is not usable."""
    if isinstance(value, BadRecord):
        return value
    if isinstance(value, StreamedText):  # the same checks, worked out while reading it
        if value.nul:
            return BadRecord("nul_bytes", where, "text contains NUL bytes")
        if value.blank:
            return BadRecord("empty", where, "empty document")
        limit = cfg["max_document_chars"]
        if limit is not None and value.chars > limit:
            return BadRecord("too_long", where, f"document of {value.chars} characters exceeds data.max_document_chars {limit}")
        return value
    if not isinstance(value, str):
        return BadRecord("not_string", where, f"text is {type(value).__name__}, not a string")
    if "\x00" in value:
        return BadRecord("nul_bytes", where, "text contains NUL bytes")
    if not value or value.isspace():  # as `not value.strip()`, without copying the text
        return BadRecord("empty", where, "empty document")
    limit = cfg["max_document_chars"]
    if limit is not None and len(value) > limit:
        return BadRecord("too_long", where, f"document of {len(value)} characters exceeds data.max_document_chars {limit}")
    return value


def documents(
    source: str, cfg: dict, stats: ReadStats, keep=lambda index: True, stride=None, part=None, streamed: bool = False
) -> Iterator[tuple[int, str]]:
    """(record index, text) of the usable documents of `source` whose index `keep` accepts.

    Bad records stop the run (on_bad_record: fail) or are counted by reason (skip); empty
    documents are always counted and skipped. Record indices count every record, so they
    do not move when the policy changes. A source that cannot be read (BadSource: unreadable,
    damaged part way, or without any record) stops the run naming it, or under skip is counted
    once in stats.bad_sources, keeping the documents read before the break.
    stride (shard, n): a promise that `keep` accepts only indices i with i % n == shard.
    part (sources.ByteRange): read only that byte range of a plain JSONL file, each record's index being
    its line's byte offset (its identity there; `keep` takes it too); the bytes read go to stats.bytes_read.
    stats: a ReadStats, or one per shard behind the same calls (tokenize_job.ShardedStats: `of(record
    index)` is the record's shard's, `skip(BadSource)` counts a broken source in each shard).
    streamed: a record over HUGE_RECORD_BYTES comes as a StreamedText (read in bounded memory), else as a str.
    """
    limit = cfg["max_records_per_source"]
    if part is not None and limit is not None:  # a count from the file's start: get-data cuts no file under one
        raise ValueError(
            f"{source} was cut into byte ranges, which data.max_records_per_source does not allow: run get-data again"
        )
    index = 0
    try:
        try:
            for where, value in records(source, cfg, keep, stride, part, stats.bytes_read):
                if where is None:  # `value` records in a row that `keep` rejects, not read
                    index += value
                    if limit is not None and index >= limit:
                        return
                    continue
                if limit is not None and index >= limit:
                    return
                index += 1
                ident = index - 1 if part is None else where.offset
                if not keep(ident):
                    continue
                result = check(where, value, cfg)
                mine = stats.of(ident)
                if isinstance(result, BadRecord):
                    if cfg["on_bad_record"] == "fail" and result.reason != "empty":
                        raise result
                    mine.skip(result)
                    continue
                mine.documents += 1
                if isinstance(result, StreamedText):
                    mine.bytes += result.nbytes
                    if not streamed:
                        result = result.read()
                else:
                    mine.bytes += len(result) if result.isascii() else len(result.encode("utf-8", "surrogatepass"))
                yield ident, result
        except Exception as exc:
            if isinstance(exc, BadRecord) or not is_read_error(exc):
                raise
            raise broken(source, exc, f"{index} records" if index else None) from exc
        if not index and part is None:  # a range may hold no record (a blank cut file: 0 documents in by_source)
            raise BadSource("empty_source", source, "holds no records (a 0-byte or blank file?)")
    except BadSource as err:
        if cfg["on_bad_record"] == "fail" or err.reason == "corrupt_source":
            raise
        stats.skip(err)


def iter_documents(cfg: dict, stats: ReadStats | None = None) -> Iterator[str]:
    """Every usable document of every source (data section `cfg`), in order."""
    stats = stats if stats is not None else ReadStats()
    for source in expand_sources(paths(cfg["sources"])):
        for _, text in documents(source, cfg, stats):
            yield text


__all__ = [  # what other modules use; the rest is in the kind's module
    "HF_PREFIX",
    "JSONL_SUFFIXES",
    "BadRecord",
    "BadSource",
    "ReadStats",
    "SOURCE_BYTES",
    "SOURCE_HASHES",
    "SourceChanged",
    "StreamedText",
    "check",
    "documents",
    "iter_documents",
    "locate",
    "records",
]
