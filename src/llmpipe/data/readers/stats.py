"""What reading found: bad records and sources (BadRecord, BadSource, the skip policy's counts)."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


SHOW_LOCATIONS = 5  # offending locations logged per reason under on_bad_record: skip


class BadRecord(ValueError):
    """A record without usable text; `reason` is the counted category."""

    def __init__(self, reason: str, where: str, detail: str):
        super().__init__(f"{where}: {detail}")
        self.reason, self.where, self.detail = reason, where, detail

    def __reduce__(self):  # pickled whole (get-data's counting processes raise it in the parent)
        return type(self), (self.reason, self.where, self.detail)


class BadSource(BadRecord):
    """A source that cannot be read, whole or from some point on; `where` is the source itself.

    reason: unreadable_source (nothing could be read: a directory, no permission, not gzip/zstd data),
    damaged_source (reading broke after some records: a truncated compressed stream, or bytes after its
    last whole stream that are not another; under on_bad_record: skip the complete records read before the
    break are kept), empty_source (no records at all: a 0-byte or blank file), corrupt_source (a compressed
    stream damaged after some of its records were read: those may be damaged too; stops the run whatever
    on_bad_record says)."""


@dataclass
class ReadStats:
    documents: int = 0
    bytes: int = 0  # UTF-8 bytes of the documents kept
    skipped: Counter = field(default_factory=Counter)  # reason -> count
    examples: dict = field(default_factory=dict)  # reason -> first few locations
    # Sources skipped whole or in part (on_bad_record: skip): reason -> {source: message}. A source is counted
    # once however many shards read it (every shard reads every source when sources < shards).
    bad_sources: dict = field(default_factory=dict)
    # Bytes read from each source split into byte ranges (sources.ByteRange): source -> bytes. Only such
    # sources appear (the stats of every other read keep their exact form).
    bytes_read: dict = field(default_factory=dict)
    # Long documents (llmpipe.data.long_docs: encoded in pieces, pre-tokens split, documents skipped or
    # encoded whole): counter -> count. Only non-zero counters appear.
    long: Counter = field(default_factory=Counter)

    def of(self, record_index: int) -> ReadStats:
        """The stats a record's outcome goes to (this one; tokenize_job.ShardedStats routes by shard)."""
        return self

    def skip(self, err: BadRecord, quiet: bool = False) -> None:
        if isinstance(err, BadSource):
            seen = self.bad_sources.setdefault(err.reason, {})
            if err.where not in seen:
                seen[err.where] = str(err)
                if not quiet:
                    log.warning("skipped source (%s) %s", err.reason, err)
            return
        self.skipped[err.reason] += 1
        shown = self.examples.setdefault(err.reason, [])
        if len(shown) < SHOW_LOCATIONS:
            shown.append(str(err))
            log.warning("skipped (%s) %s", err.reason, err)

    def as_dict(self) -> dict:
        out = {
            "documents": self.documents,
            "bytes": self.bytes,
            "skipped": dict(self.skipped),
            "skipped_total": sum(self.skipped.values()),
            "skipped_examples": self.examples,
        }
        if self.bad_sources:  # only then: the stats of a clean read keep their exact form
            out["sources_skipped"] = {reason: len(seen) for reason, seen in self.bad_sources.items()}
            out["sources_skipped_total"] = len({src for seen in self.bad_sources.values() for src in seen})
            out["sources_skipped_examples"] = self.bad_sources
        if self.bytes_read:
            out["bytes_read"] = self.bytes_read
        if +self.long:
            out["long_documents"] = dict(+self.long)
        return out

    def add(self, other: dict) -> None:
        self.documents += other["documents"]
        self.bytes += other["bytes"]
        self.skipped.update(other["skipped"])
        for reason, shown in other["skipped_examples"].items():
            self.examples.setdefault(reason, []).extend(shown[: SHOW_LOCATIONS - len(self.examples.get(reason, []))])
        for reason, seen in other.get("sources_skipped_examples", {}).items():
            mine = self.bad_sources.setdefault(reason, {})
            for src, message in seen.items():
                mine.setdefault(src, message)
        for src, n in other.get("bytes_read", {}).items():
            self.bytes_read[src] = self.bytes_read.get(src, 0) + n
        self.long.update(other.get("long_documents", {}))


class CorruptData(OSError):
    """Compressed data that fails to decode, or its checksum, after part of its stream was handed out: what
    came before in that stream may be damaged too, so its records cannot be kept (a truncated file is an
    EOFError instead: what came before is whole)."""


def is_read_error(exc: BaseException) -> bool:
    """An error of reading or decompressing a source's bytes (not of the records in it)."""
    import lzma
    import zlib

    module = type(exc).__module__ or ""
    return isinstance(exc, (OSError, EOFError, zlib.error, lzma.LZMAError)) or module.startswith(
        ("backports.zstd", "compression.zstd", "igzip_lib", "isal", "pyarrow", "fsspec")
    )


def broken(source: str, exc: BaseException, reached: str | None) -> BadSource:
    """The BadSource for a read that failed with `exc` after `reached` ("line 12, 11 records"; None: nothing)."""
    what = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, CorruptData):  # never skipped: records already read may be damaged
        return BadSource("corrupt_source", source, f"corrupt after {reached or 'the start'}: {exc}")
    if reached is None or reached.endswith(", 0 records"):
        reason = "damaged_source" if isinstance(exc, EOFError) else "unreadable_source"
        return BadSource(reason, source, f"cannot be read ({what})")
    return BadSource("damaged_source", source, f"unreadable after {reached} ({what}); the rest of the file is lost")
