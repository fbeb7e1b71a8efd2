"""Read documents from one source: a local path or fsspec URL (JSONL[.gz|.zst], Parquet, text) or a
Hugging Face dataset ("hf:<id or local folder>"), under an explicit bad-record policy."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import orjson

from llmpipe.data.sources import HF_PREFIX, expand_sources, paths

log = logging.getLogger(__name__)

SHOW_LOCATIONS = 5  # offending locations logged per reason under on_bad_record: skip
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
TEXT_SUFFIXES = (".txt",)


class BadRecord(ValueError):
    """A record without usable text; `reason` is the counted category."""

    def __init__(self, reason: str, where: str, detail: str):
        super().__init__(f"{where}: {detail}")
        self.reason, self.where = reason, where


class BadSource(BadRecord):
    """A source that cannot be read, whole or from some point on; `where` is the source itself.

    reason: unreadable_source (nothing could be read: a directory, no permission, not gzip/zstd data),
    damaged_source (reading broke after some records: a truncated or corrupt compressed stream; under
    on_bad_record: skip the complete records read before the break are kept), empty_source (no records
    at all: a 0-byte or blank file)."""


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


def _compression(url: str) -> str | None:
    return {"gz": "gzip", "zst": "zstd", "bz2": "bz2", "xz": "xz"}.get(url.rsplit(".", 1)[-1].lower())


def _base_name(url: str) -> str:
    name = url.lower()
    return name.rsplit(".", 1)[0] if _compression(url) else name


# Bytes read from storage per source by this process (compressed bytes for .gz / .zst): a tokenize job's
# read accounting (tokenize.py writes it beside its shards, the token store sums it: one read per byte).
SOURCE_BYTES: Counter = Counter()


class _Counted:
    """A binary file whose reads add to SOURCE_BYTES[url]; everything else is the file's own."""

    def __init__(self, fh, url: str):
        self._fh, self._url = fh, url

    def read(self, size: int = -1) -> bytes:
        data = self._fh.read(size)
        SOURCE_BYTES[self._url] += len(data)
        return data

    def readinto(self, buf) -> int:
        n = self._fh.readinto(buf)
        SOURCE_BYTES[self._url] += n or 0
        return n

    def __getattr__(self, name: str):
        return getattr(self._fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._fh.close()


@contextlib.contextmanager
def _open_raw(url: str, compression: str | None = None):
    """A local path by the builtin open (fsspec's import costs every job ~0.08 s), anything else by fsspec.
    Without `compression` the bytes read are counted in SOURCE_BYTES."""
    if "://" not in url and compression is None:
        with open(url, "rb") as fh:
            yield _Counted(fh, url)
        return
    import fsspec

    if compression is not None:  # bz2 / xz: fsspec decompresses; count the compressed file's bytes under it
        with fsspec.open(url, "rb") as raw, fsspec.compression.compr[compression](_Counted(raw, url), mode="rb") as fh:
            yield fh
        return
    with fsspec.open(url, "rb") as fh:
        yield _Counted(fh, url)


@contextlib.contextmanager
def _open_binary(url: str) -> Iterator:
    """A line-iterable binary stream of `url`, decompressed by its suffix."""
    comp = _compression(url)
    if comp not in ("zstd", "gzip"):
        with _open_raw(url, comp) as fh:
            yield fh
        return
    with _open_raw(url) as raw:
        if comp == "gzip":  # ISA-L's gzip reader: same bytes as the gzip module, ~2.5x faster
            from isal import igzip

            with igzip.IGzipFile(fileobj=raw, mode="rb") as fh:
                yield fh
        else:
            yield _ZstdStream(raw)


class _ZstdStream:
    """Decompressed bytes of a zstd stream of one or more frames; a stream cut inside a frame raises
    EOFError (zstandard's stream_reader would end there without a word)."""

    def __init__(self, raw, size: int = 1 << 20):
        import zstandard

        self.raw, self.size, self.new = raw, size, zstandard.ZstdDecompressor().decompressobj
        self.dobj, self.fed = self.new(), False

    def _more(self) -> bytes | None:
        """The next decompressed piece (maybe empty); None at the end of the input."""
        data = self.raw.read(self.size)
        if not data:
            if self.fed and not self.dobj.eof:
                raise EOFError("zstd stream ended inside a frame (truncated file?)")
            return None
        out = []
        while data:
            if self.dobj.eof:
                self.dobj = self.new()
            self.fed = True
            out.append(self.dobj.decompress(data))
            data = self.dobj.unused_data if self.dobj.eof else b""
        return b"".join(out)

    def read(self, size: int = -1) -> bytes:
        out = []
        while (piece := self._more()) is not None:
            out.append(piece)
            if size >= 0 and piece:
                break
        return b"".join(out)


BOM = b"\xef\xbb\xbf"


LINE_CHUNK = 1 << 20  # bytes read at a time by _lines


def _lines(fh, size: int | None = None) -> Iterator[bytes | HugeLine]:
    """The lines of a binary stream ending in LF, CRLF or CR (universal newlines, as Python's text
    mode and editors count them; JSON never holds a raw CR inside a string), streamed. A line found
    longer than HUGE_RECORD_BYTES comes as a HugeLine (read on from the stream by its consumer)."""
    size = size or LINE_CHUNK
    buf = bytearray()
    while chunk := fh.read(size):
        start = max(len(buf) - 1, 0)  # a held-back CR may pair with an LF at the chunk's start
        buf += chunk
        end = len(buf) - 1 if buf.endswith(b"\r") else len(buf)  # hold back a final CR
        cut = max(buf.rfind(b"\n", start, end), buf.rfind(b"\r", start, end))
        if cut >= 0:
            yield from bytes(buf[: cut + 1]).splitlines(keepends=True)
            del buf[: cut + 1]
        elif len(buf) > HUGE_RECORD_BYTES:  # a line too long to hold: handed out as a stream (HugeLine)
            huge, buf = HugeLine(buf, fh, size), bytearray()
            yield huge
            buf += huge.finish()  # the bytes read past its end: whole lines out now, the last one kept
            end = len(buf) - 1 if buf.endswith(b"\r") else len(buf)
            cut = max(buf.rfind(b"\n", 0, end), buf.rfind(b"\r", 0, end))
            if cut >= 0:
                yield from bytes(buf[: cut + 1]).splitlines(keepends=True)
                del buf[: cut + 1]
    if buf:
        yield from bytes(buf).splitlines(keepends=True)


# ---------------------------------------------------------------- records too long to hold
# A line (JSONL record) or text file longer than HUGE_RECORD_BYTES is not held: it is read in chunks of
# HUGE_CHUNK bytes. A JSONL record is scanned once (_JsonScan): everything but its long strings is kept (the
# "skeleton", which orjson then parses, so bad JSON, a missing or non-string field are judged by orjson as for
# any record), its long strings are decoded piece by piece (json.loads of segments cut between escapes) and
# the text field's value is spooled to an anonymous temporary file. The document is then a StreamedText:
# what check() needs, worked out while reading, and its text in chunks, read again for each use.
HUGE_RECORD_BYTES = 16 << 20
HUGE_CHUNK = 1 << 20
LONG_STRING = 1 << 20  # characters: a JSON string longer than this in a huge record is streamed, not held


class HugeLine:
    """A line of a binary stream too long to hold: read() hands out its bytes (without the line end) in
    chunks, b"" at its end; finish() skips to its end and returns the bytes read past it."""

    def __init__(self, head: bytes | bytearray, fh, size: int):
        # pending: handed out first, `size` bytes at a time from its front (a bytearray: no copy of the rest)
        self.pending = head if isinstance(head, bytearray) else bytearray(head)
        self.fh, self.size = fh, size
        self.done, self.rest, self.offset = False, b"", 0  # offset: leading bytes dropped (BOM, blanks)
        self.odd_blank = False  # dropped leading blanks held \\v or \\f (not JSON whitespace)

    def read(self) -> bytes:
        while not self.done:
            if self.pending:
                data = bytes(self.pending[: self.size])
                del self.pending[: self.size]
            else:
                data = self.fh.read(self.size)
                if not data:
                    self.done = True
                    return b""
            m = _LINE_END.search(data)
            if m is None:
                return data
            i, self.done = m.start(), True
            self.rest, self.pending = data[i + 1 :] + self.pending, bytearray()
            if data[i] == 13:  # CR: CRLF is one line end
                if not self.rest:
                    self.rest = self.fh.read(self.size)
                if self.rest.startswith(b"\n"):
                    self.rest = self.rest[1:]
            return data[:i]
        return b""

    def unread(self, data: bytes) -> None:
        """Put `data` (just read) back in front."""
        if self.done:  # read() finds the line end again, then the bytes past it
            self.done, self.pending, self.rest = False, bytearray(data + b"\n" + self.rest), b""
        else:
            self.pending[:0] = data

    def strip_bom(self) -> None:
        if self.pending.startswith(BOM):
            del self.pending[: len(BOM)]

    def blank(self) -> bool:
        """Only whitespace (bytes.strip)? Leading whitespace is dropped (counted in `offset`)."""
        if _NOT_WHITE.search(self.pending):
            return False
        while data := self.read():
            kept = data.lstrip(WHITESPACE)
            self.odd_blank |= bool(set(data[: len(data) - len(kept)]) & {11, 12})
            self.offset += len(data) - len(kept)
            if kept:
                self.unread(kept)
                return False
        return True

    def finish(self) -> bytes:
        while self.read():
            pass
        return self.rest


_LINE_END = re.compile(rb"[\r\n]")
_NOT_WHITE = re.compile(rb"[^ \t\n\r\x0b\x0c]")  # a byte bytes.strip() keeps


class StreamedText:
    """A document too long to hold, read piece by piece: chunks() yields its text (each call reads it again).
    chars, nbytes (UTF-8), nul (holds U+0000), blank (only whitespace, as str.strip sees it): for check()."""

    def __init__(self, opener, chars: int, nbytes: int, nul: bool, blank: bool, keep=None):
        self.opener, self.chars, self.nbytes, self.nul, self.blank = opener, chars, nbytes, nul, blank
        self._keep = keep  # what must live as long as the document (its spool file)

    def __len__(self) -> int:
        return self.chars

    def chunks(self) -> Iterator[str]:
        return self.opener()

    def read(self) -> str:
        """The whole text (memory as a str document)."""
        return "".join(self.chunks())


def _utf8_cut(data: bytes) -> int:
    """Bytes of `data` up to a possibly incomplete last UTF-8 sequence (held back for the next chunk)."""
    n = len(data)
    for k in range(1, min(4, n) + 1):
        c = data[n - k]
        if c < 0x80:
            return n
        if c >= 0xC0:
            need = 2 if c < 0xE0 else 3 if c < 0xF0 else 4
            return n - k if need > k else n
    return n


SMALL_PIECE = 8 << 10  # bytes decoded at a time where the text is only checked, scanned or spooled


def _small(chunks) -> Iterator[bytes]:
    """`chunks` cut into SMALL_PIECE pieces. Decoding 1 MiB at a time into short-lived str made glibc's heap
    creep (peak RSS +8 MB from 30 to 300 MB of text read); allocations this small are reused."""
    for chunk in chunks:
        for at in range(0, len(chunk), SMALL_PIECE):
            yield chunk[at : at + SMALL_PIECE]


def _decoded(pieces: Iterator[bytes], at: int = 0, bad: list | None = None) -> Iterator[str]:
    """The UTF-8 text of a stream of bytes, strictly decoded; on invalid UTF-8, `bad` gets the offset of the
    first invalid byte (counted from `at`, as bytes.decode reports it for the whole) and the rest is skipped."""
    carry = b""
    for data in pieces:
        if bad:
            continue
        data = carry + data
        cut = _utf8_cut(data)
        try:
            text = data[:cut].decode("utf-8")
        except UnicodeDecodeError as exc:
            bad.append(at + exc.start)
            continue
        at, carry = at + cut, data[cut:]
        if text:
            yield text
    if carry and not bad:
        try:
            yield carry.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad.append(at + exc.start)


def _spool_reader(fh) -> Iterator[str]:
    import codecs

    fh.seek(0)
    dec = codecs.getincrementaldecoder("utf-8")()
    while data := fh.read(HUGE_CHUNK):
        if text := dec.decode(data):
            yield text
    if text := dec.decode(b"", final=True):
        yield text


_SURROGATE = re.compile("[\ud800-\udfff]")
_STRUCTURE = re.compile(r"[{}\[\]:,]")
_HIGH_ESCAPE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}")
_PLACEHOLDER = "\\u0000llmpipe-huge-{}"  # a streamed string in the skeleton (JSON escape of a NUL + a number)


class _Tally:
    """A streamed string's text: spooled (`fh`) when it is the document, and what check() needs."""

    def __init__(self, spool: bool):
        import tempfile

        self.fh = tempfile.TemporaryFile() if spool else None
        self.chars = self.nbytes = 0
        self.nul, self.blank = False, True

    def add(self, text: str) -> None:
        self.chars += len(text)
        self.nul = self.nul or "\x00" in text
        self.blank = self.blank and (not text or text.isspace())
        data = text.encode("utf-8")
        self.nbytes += len(data)
        if self.fh is not None:
            self.fh.write(data)

    def text(self) -> StreamedText:
        fh = self.fh
        return StreamedText(lambda: _spool_reader(fh), self.chars, self.nbytes, self.nul, self.blank, fh)


class _JsonScan:
    """One JSONL record fed as text: keeps its skeleton (long strings replaced by placeholders), decodes the
    long strings segment by segment and spools those that are the value of the top-level `field`."""

    def __init__(self, field: str):
        self.field, self.buf, self.skel = field, "", []
        self.in_str, self.long = False, None  # in a string; its _Tally when streamed
        self.depth, self.top_obj, self.expect_key, self.last_key = 0, False, False, None
        self.is_key = self.is_text = False
        self.error, self.streamed, self.spools = None, 0, {}

    def feed(self, text: str) -> None:
        self.buf += text
        self._run(False)

    def _structure(self, stretch: str) -> None:
        for ch in _STRUCTURE.findall(stretch):
            if ch in "{[":
                self.depth += 1
                if self.depth == 1:
                    self.top_obj, self.expect_key = ch == "{", True
            elif ch in "}]":
                self.depth -= 1
            elif self.depth == 1:
                self.expect_key = ch == ","

    def _run(self, final: bool) -> None:
        buf, pos = self.buf, 0
        while True:
            if not self.in_str:
                q = buf.find('"', pos)
                stretch = buf[pos:] if q < 0 else buf[pos:q]
                self._structure(stretch)
                self.skel.append(stretch)
                if q < 0:
                    pos = len(buf)
                    break
                top = self.depth == 1 and self.top_obj
                self.is_key = top and self.expect_key
                self.is_text = top and not self.expect_key and self.last_key == self.field
                self.in_str, pos = True, q + 1
                continue
            end = _closing_quote(buf, pos)
            if end >= 0:
                if self.long is None:
                    self.skel.append('"' + buf[pos:end] + '"')
                    if self.is_key:
                        try:
                            self.last_key = json.loads('"' + buf[pos:end] + '"')
                        except ValueError:
                            self.last_key = None  # orjson rejects the skeleton
                else:
                    self._segment(buf[pos:end])
                    self._end_long()
                self.in_str, pos = False, end + 1
                continue
            if final or (self.long is None and len(buf) - pos <= LONG_STRING):
                break  # more to come (or an unterminated string: orjson rejects the skeleton)
            if self.long is None:
                self.long = _Tally(self.is_text)
            cut = _segment_cut(buf, pos)
            if cut > pos:
                self._segment(buf[pos:cut])
                pos = cut
            break
        self.buf = buf[pos:]

    def _segment(self, raw: str) -> None:
        if self.error is not None:
            return
        try:
            text = json.loads('"' + raw + '"')
        except ValueError as exc:
            self.error = getattr(exc, "msg", str(exc))
            return
        if _SURROGATE.search(text):  # a lone surrogate escape (segments never split a pair): orjson rejects it
            self.error = "lone surrogate in string"
            return
        self.long.add(text)

    def _end_long(self) -> None:
        name = _PLACEHOLDER.format(self.streamed)
        self.streamed += 1
        self.skel.append('"' + name + '"')
        if self.is_key:
            self.last_key = None
        if self.long.fh is not None:
            self.spools[json.loads('"' + name + '"')] = self.long
        self.long = None

    def result(self, where: str) -> object:
        self._run(True)
        if self.in_str:  # unterminated: keep it in the skeleton, orjson says what is wrong
            self.skel.append('"' + self.buf)
        if self.error is not None:
            return BadRecord("bad_json", where, f"not valid JSON ({self.error})")
        try:
            record = orjson.loads("".join(self.skel))
        except orjson.JSONDecodeError as exc:
            return BadRecord("bad_json", where, f"not valid JSON ({exc.msg})")
        if not isinstance(record, dict) or self.field not in record:
            return BadRecord("missing_field", where, f"no '{self.field}' field")
        value = record[self.field]
        if isinstance(value, str) and value in self.spools:
            return self.spools[value].text()
        return value


def _closing_quote(buf: str, pos: int) -> int:
    """The first unescaped '"' of a JSON string's content from `pos` (an escape boundary), or -1."""
    i = pos
    while (q := buf.find('"', i)) >= 0:
        k = q
        while k > pos and buf[k - 1] == "\\":
            k -= 1
        if (q - k) % 2 == 0:
            return q
        i = q + 1
    return -1


def _escape_start(buf: str, pos: int, i: int) -> bool:
    """buf[i] == '\\\\' starts an escape (an even run of backslashes from `pos`, an escape boundary, before it)."""
    k = i
    while k > pos and buf[k - 1] == "\\":
        k -= 1
    return (i - k) % 2 == 0


def _segment_cut(buf: str, pos: int) -> int:
    """The largest c <= len(buf) such that buf[pos:c] splits no escape and no \\\\uD8xx\\\\uDCxx surrogate pair."""
    n = len(buf)
    i = buf.rfind("\\", max(pos, n - 12))
    if i < 0 or not _escape_start(buf, pos, i):
        return n  # the last backslash is an escaped one: every escape before it is complete
    size = 6 if buf[i + 1 : i + 2] == "u" else 2
    if i + size < n or (i + size == n and not _HIGH_ESCAPE.fullmatch(buf, i, n)):
        return n
    if i - 6 >= pos and _HIGH_ESCAPE.fullmatch(buf, i - 6, i) and _escape_start(buf, pos, i - 6):
        return i - 6  # a high surrogate escape right before an incomplete one: keep them together
    return i


def _huge_json(line: HugeLine, field: str, where: str) -> object:
    """The text (StreamedText or a short value) or BadRecord of a record too long to hold, read to its end."""
    scan, bad = _JsonScan(field), []
    if line.odd_blank:
        scan.error = "unexpected character"
    for text in _decoded(_small(iter(line.read, b"")), line.offset, bad):
        scan.feed(text)
    line.finish()
    if bad:
        return BadRecord("invalid_utf8", where, f"invalid UTF-8 at byte {bad[0]}")
    return scan.result(where)


# Bytes that bytes.strip() removes: a line of only these is blank (not a record).
WHITESPACE = b" \t\n\r\x0b\x0c"
# Internal switch: False reads every record line one by one even when a shard keeps only its own records
# (the reference path the byte-identity test compares the strided scan with).
STRIDED_SCAN = True
STRIDE_BLOCK = 1 << 21  # bytes read at a time by the strided scan
STRIDE_MIN = 4  # below 4 shards per record-level source, reading each line is as fast


def _each_line(lines, keep, pos: list[int], lineno: int = 0) -> Iterator[tuple[int | None, object]]:
    """(line number, raw line) per record of `lines` whose index `keep` accepts, else (None, 1).
    pos: [lines, records] reached, kept up to date (error messages name them)."""
    for raw in lines:
        lineno += 1
        pos[0] = lineno
        if isinstance(raw, HugeLine):
            if lineno == 1:
                raw.strip_bom()
            if raw.blank():
                continue
        else:
            if lineno == 1 and raw.startswith(BOM):  # a UTF-8 byte order mark (Windows editors)
                raw = raw[len(BOM) :]
            if not raw or raw.isspace():  # blank, as `not raw.strip()` without copying the line
                continue
        pos[1] += 1
        if keep is not None and not keep(pos[1] - 1):
            yield None, 1
            continue
        yield lineno, raw


def _whitespace():
    import numpy as np

    white = np.zeros(256, bool)
    white[list(WHITESPACE)] = True
    return white


def _lf_lines(block: bytes, white):
    """(starts, ends, record) of the lines of `block`: whole lines ended by LF (the last maybe unended), no CR,
    not the file's first line (no BOM). ends: index of each line's last byte; record: the line is not blank."""
    import numpy as np

    arr = np.frombuffer(block, np.uint8)
    ends = np.flatnonzero(arr == 10)
    if block[-1:] != b"\n":
        ends = np.append(ends, arr.size - 1)
    starts = np.concatenate([[0], ends[:-1] + 1])
    record = ~white[arr[starts]]  # a line not starting with whitespace is a record; the others are looked at
    for line in np.flatnonzero(~record).tolist():
        record[line] = bool(block[int(starts[line]) : int(ends[line]) + 1].strip())
    return starts, ends, record


def _strided_lines(fh, keep, stride: tuple[int, int], pos: list[int]):
    """_each_line's records for a shard that keeps only indices i with i % n == shard (stride (shard, n)) of
    an uncompressed stream: line ends, blank lines and record indices come from numpy over each block of
    whole lines, so the other shards' records cost no Python per line; (None, k) stands for k records not
    parsed. Blocks holding a CR (CRLF or CR line ends) and the file's first block (a BOM) go line by line.
    A line found longer than HUGE_RECORD_BYTES comes as a HugeLine (read on from `fh`), as from _lines."""
    import numpy as np

    shard, n = stride
    white = _whitespace()
    buf, first = bytearray(), True
    while True:
        chunk = fh.read(STRIDE_BLOCK)
        buf += chunk
        # whole lines: up to the last LF, or a CR that is not the last byte (an LF may follow it); at the end all
        cut = max(buf.rfind(b"\n"), buf.rfind(b"\r", 0, len(buf) - 1)) + 1 if chunk else len(buf)
        if not cut:
            if not chunk:
                return
            if len(buf) > HUGE_RECORD_BYTES:  # one line too long to hold: its record, if any, goes on as a stream
                huge, buf = HugeLine(buf, fh, STRIDE_BLOCK), bytearray()
                yield from _each_line([huge], keep, pos, pos[0])
                buf += huge.finish()  # the bytes read past its end
                first = False
            continue
        block = bytes(buf[:cut])
        del buf[:cut]
        if first or b"\r" in block:
            yield from _each_line(block.splitlines(keepends=True), keep, pos, pos[0])
            first = False
            continue
        starts, ends, record = _lf_lines(block, white)
        index = pos[1] + np.cumsum(record) - 1  # record index of each line (where `record`)
        lines_before, done = pos[0], pos[1]
        for line in np.flatnonzero(record & (index % n == shard)).tolist():
            at = int(index[line])
            if at > done:
                yield None, at - done
            pos[0], pos[1], done = lines_before + line + 1, at + 1, at + 1
            if keep is not None and not keep(at):
                yield None, 1
                continue
            yield pos[0], block[int(starts[line]) : int(ends[line]) + 1]
        total = int(index[-1]) + 1 if record.any() else done
        if total > done:
            yield None, total - done
        pos[0], pos[1] = lines_before + ends.size, total
        if not chunk:
            return


def split_points(url: str, n: int) -> list[tuple[int, int, int]]:
    """Where to cut a plain (uncompressed) JSONL file into `n` byte ranges of about equal size, each but the
    first starting at a record: (byte offset, index of the record there, its line number) for each range's
    start, then (size, records in the file, lines + 1) for the end. A range whose target falls past the last
    record starts at the end (empty). One sequential pass; lines, blank lines and record indices are
    counted by the readers' own code: _lf_lines (the strided scan's blocks) and _each_line (blocks
    holding a CR, and the first one: a BOM), so the numbering is that of a whole-file read."""
    import numpy as np

    white = _whitespace()
    with _open_binary(url) as fh:
        size = fh.seek(0, 2)
        fh.seek(0)
        targets = [k * size // n for k in range(1, n)]
        out = [(0, 0, 1)]
        pos = [0, 0]  # lines, records before the block
        at, buf, first = 0, b"", True  # at: the block's byte offset
        while True:
            chunk = fh.read(STRIDE_BLOCK)
            buf += chunk
            # whole lines: up to the last LF, or a CR that is not the last byte (an LF may follow it)
            cut = max(buf.rfind(b"\n"), buf.rfind(b"\r", 0, len(buf) - 1)) + 1 if chunk else len(buf)
            if not cut:
                if not chunk:
                    break
                continue
            block, buf = buf[:cut], buf[cut:]
            if first or b"\r" in block:
                lines = block.splitlines(keepends=True)
                line_at = np.concatenate([[0], np.cumsum([len(x) for x in lines], dtype=np.int64)])
                base, found = pos[0], []
                for lineno, _ in _each_line(lines, None, pos, pos[0]):
                    found.append((lineno - base - 1, pos[1] - 1))
                rec = np.array([f[0] for f in found], np.int64)
                offs, idx = at + line_at[rec], np.array([f[1] for f in found], np.int64)
                line_no = base + rec + 1
                pos[0] = base + len(lines)
                first = False
            else:
                starts, ends, record = _lf_lines(block, white)
                rec = np.flatnonzero(record)
                offs, idx, line_no = at + starts[rec], pos[1] + np.arange(rec.size), pos[0] + rec + 1
                pos[0] += ends.size
                pos[1] += rec.size
            while targets and offs.size and targets[0] <= offs[-1]:
                j = int(np.searchsorted(offs, targets.pop(0)))
                out.append((int(offs[j]), int(idx[j]), int(line_no[j])))
            at += len(block)
            if not chunk:
                break
    end = (size, pos[1], pos[0] + 1)
    return out + [end] * (len(targets) + 1)


class SourceChanged(RuntimeError):
    """A source split into byte ranges whose file changed after get-data recorded them."""


class _Bounded:
    """At most `left` bytes of `fh`, from where it stands; `tally[url]` counts the bytes read."""

    def __init__(self, fh, left: int, tally: dict, url: str):
        self.fh, self.left, self.tally, self.url = fh, left, tally, url
        tally.setdefault(url, 0)

    def read(self, size: int = -1) -> bytes:
        data = self.fh.read(self.left if size < 0 else min(size, self.left)) if self.left > 0 else b""
        self.left -= len(data)
        self.tally[self.url] += len(data)
        return data


def _byte_range(fh, url: str, part, tally: dict) -> _Bounded:
    """The bytes [part.start, part.end) of an uncompressed source, after checking it still has the size
    get-data split it at."""
    size = fh.seek(0, 2)
    if size != part.size:
        raise SourceChanged(
            f"data source {url} changed after get-data split it into byte ranges ({size} bytes now, "
            f"{part.size} recorded in sources.json): run get-data again (Snakemake does when a corpus file changes)"
        )
    fh.seek(part.start)
    return _Bounded(fh, part.end - part.start, tally, url)


def _jsonl(url: str, text_field: str, keep=None, stride=None, part=None, tally=None) -> Iterator[tuple[str | None, object]]:
    """`keep(record index)` false: the record is not parsed ((None, k) stands for k such records in a row).
    stride (shard, n): `keep` accepts only indices i with i % n == shard (an uncompressed file is then
    scanned by blocks, see _strided_lines). part (sources.ByteRange): read only those bytes of an
    uncompressed file, numbering records and lines from where the range starts; `tally` counts the bytes."""
    pos = [0, 0] if part is None else [part.first_line - 1, part.first_record]
    try:
        with _open_binary(url) as fh:
            if part is not None:
                ranged = _byte_range(fh, url, part, tally if tally is not None else {})
                lines = _each_line(_lines(ranged), keep, pos, pos[0])
            elif stride is not None and stride[1] >= STRIDE_MIN and keep is not None and STRIDED_SCAN and not _compression(url):
                lines = _strided_lines(fh, keep, stride, pos)
            else:
                lines = _each_line(_lines(fh), keep, pos)
            for lineno, raw in lines:
                if lineno is None:
                    yield None, raw
                    continue
                where = f"{url}:{lineno}"
                if isinstance(raw, HugeLine):
                    yield where, _huge_json(raw, text_field, where)
                    continue
                try:
                    record = orjson.loads(raw)  # validates UTF-8 too
                except orjson.JSONDecodeError as exc:
                    try:
                        raw.decode("utf-8")
                    except UnicodeDecodeError as uexc:
                        yield where, BadRecord("invalid_utf8", where, f"invalid UTF-8 at byte {uexc.start}")
                        continue
                    yield where, BadRecord("bad_json", where, f"not valid JSON ({exc.msg})")
                    continue
                if not isinstance(record, dict) or text_field not in record:
                    yield where, BadRecord("missing_field", where, f"no '{text_field}' field")
                    continue
                yield where, record[text_field]
    except Exception as exc:
        if isinstance(exc, BadRecord) or not is_read_error(exc):
            raise
        raise broken(url, exc, f"line {pos[0]}, {pos[1]} records") from exc


def is_read_error(exc: BaseException) -> bool:
    """An error of reading or decompressing a source's bytes (not of the records in it)."""
    import lzma
    import zlib

    module = type(exc).__module__ or ""
    return isinstance(exc, (OSError, EOFError, zlib.error, lzma.LZMAError)) or module.startswith(
        ("zstandard", "igzip_lib", "isal", "pyarrow", "fsspec")
    )


def broken(source: str, exc: BaseException, reached: str | None) -> BadSource:
    """The BadSource for a read that failed with `exc` after `reached` ("line 12, 11 records"; None: nothing)."""
    what = f"{type(exc).__name__}: {exc}"
    if reached is None or reached.endswith(", 0 records"):
        reason = "damaged_source" if isinstance(exc, EOFError) else "unreadable_source"
        return BadSource(reason, source, f"cannot be read ({what})")
    return BadSource("damaged_source", source, f"unreadable after {reached} ({what}); the rest of the file is lost")


PARQUET_BATCH = 256  # rows decoded at a time


def _parquet_file(fh):
    """A ParquetFile over a binary file object, read in bounded memory: each column chunk streamed in
    HUGE_CHUNK pieces, not pre-buffered (pyarrow's default pre_buffer kept the column chunks read from a
    Python file object: peak RSS grew with the file, +56 MB at 100 MB of text)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(fh, metadata=_parquet_footer(fh), pre_buffer=False, buffer_size=HUGE_CHUNK)


def _parquet_footer(fh):
    """The file's metadata, read exactly (its leading magic, the footer and its length): pyarrow's own
    open reads the last 64 KiB, then the column chunks there again. None: not a well-formed tail (pyarrow
    then opens it and names what is wrong)."""
    import io

    import pyarrow.parquet as pq

    size = fh.seek(0, 2)
    fh.seek(0)
    if size < 12 or fh.read(4) != b"PAR1":
        return None
    fh.seek(size - 8)
    tail = fh.read(8)
    n = int.from_bytes(tail[:4], "little")
    if tail[4:] != b"PAR1" or n + 12 > size:
        return None
    fh.seek(size - 8 - n)
    meta = pq.read_metadata(io.BytesIO(b"PAR1" + fh.read(n) + tail))
    fh.seek(0)
    return meta


def _parquet_values(pf, column: str) -> Iterator[object]:
    """The values of one column, PARQUET_BATCH rows decoded at a time."""
    return _arrow_values(pf.iter_batches(columns=[column], batch_size=PARQUET_BATCH, use_threads=False), column)


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
        for at in range(0, len(values), PARQUET_BATCH):
            yield from values.slice(at, PARQUET_BATCH).to_pylist()
        del values
        pool.release_unused()


def _parquet(url: str, text_field: str) -> Iterator[tuple[str, object]]:
    with _open_raw(url) as fh:
        pf = _parquet_file(fh)
        if text_field not in pf.schema_arrow.names:
            raise BadSource("missing_field", url, f"no '{text_field}' column (columns: {', '.join(pf.schema_arrow.names)})")
        for row, value in enumerate(_parquet_values(pf, text_field)):
            yield f"{url}:row {row}", value


PARAGRAPH_BREAK = re.compile(r"(?:\r\n|\r|\n){2}")  # an empty line, in any newline style
# PARAGRAPH_BREAK on UTF-8 bytes (CR, LF never occur inside a sequence), its {2} written out in the order the
# regex tries it: the same matches, ~3.5x faster (each alternative starts with CR or LF, which sre scans for)
_BREAK_BYTES = re.compile(rb"\r\n(?:\r\n|\r|\n)|\r(?:\r\n|\r|\n)|\n(?:\r\n|\r|\n)")
BREAK_READS = 4  # bytes a PARAGRAPH_BREAK match attempt at p reads at most (p .. p + 3)


def _read_at_least(fh, n: int) -> bytes:
    """Up to `n` bytes of `fh` (fewer only at its end: some streams hand out less per read)."""
    out, have = [], 0
    while have < n and (data := fh.read(n - have)):
        out.append(data)
        have += len(data)
    return b"".join(out)


def _file_chunks(url: str) -> Iterator[bytes]:
    """The bytes of a text source in HUGE_CHUNK pieces, without a leading byte order mark."""
    with _open_binary(url) as fh:
        data = _read_at_least(fh, HUGE_CHUNK)
        yield data[len(BOM) :] if data.startswith(BOM) else data
        while data := fh.read(HUGE_CHUNK):
            yield data


def _huge_text(url: str) -> object:
    """A text file too long to hold as one document: a StreamedText reading the file again for each use,
    or BadRecord (invalid UTF-8, at the offset bytes.decode('utf-8-sig') reports)."""
    tally, bad = _Tally(False), []
    for text in _decoded(_small(_file_chunks(url)), 0, bad):
        tally.add(text)
    if bad:
        return BadRecord("invalid_utf8", url, f"invalid UTF-8 at byte {bad[0]}")
    return StreamedText(lambda: _decoded(_file_chunks(url)), tally.chars, tally.nbytes, tally.nul, tally.blank)


class _Piece:
    """The bytes of the paragraph being read: held up to HUGE_RECORD_BYTES, then spooled (decoded, counted)."""

    def __init__(self):
        self.held, self.size, self.spool, self.dec = [], 0, None, None

    def add(self, data: bytes) -> None:
        if self.spool is None and self.size + len(data) > HUGE_RECORD_BYTES:
            import codecs

            self.spool, self.dec = _Tally(True), codecs.getincrementaldecoder("utf-8")()
            for piece in _small(self.held):
                self.spool.add(self.dec.decode(piece))
            self.held = []
        if self.spool is not None:
            for piece in _small([data]):
                self.spool.add(self.dec.decode(piece))
        elif data:
            self.held.append(data)
            self.size += len(data)

    def end(self, data: bytes) -> str | StreamedText:
        """The paragraph, ending with `data`; the next one starts empty."""
        self.add(data)
        if self.spool is None:
            text = b"".join(self.held).decode("utf-8")
        else:
            self.spool.add(self.dec.decode(b"", final=True))
            text = self.spool.text()
        self.__init__()
        return text


def _paragraph_pieces(chunks: Iterator[bytes]) -> Iterator[str | StreamedText]:
    """PARAGRAPH_BREAK.split of the whole text of `chunks` (valid UTF-8), piece by piece: a str, or a StreamedText
    for a piece over HUGE_RECORD_BYTES. A break is taken once BREAK_READS bytes from its start are in: the
    regex then matches there as it does on the whole text."""
    piece, buf = _Piece(), b""  # buf: the bytes where a break may yet start (< BREAK_READS), then a chunk
    for chunk in chunks:
        buf += chunk
        start, final = 0, len(buf) - BREAK_READS + 1  # a match starting before `final` is the whole text's
        for m in _BREAK_BYTES.finditer(buf):
            if m.start() >= final:
                break
            yield piece.end(buf[start : m.start()])
            start = m.end()
        keep = max(start, final)
        piece.add(buf[start:keep])
        buf = buf[keep:]
    for data in _BREAK_BYTES.split(buf):  # the rest: the breaks in it, then the last piece
        yield piece.end(data)


def _utf8_error(head: bytes, fh) -> int | None:
    """Where `head` and the rest of `fh` (a text source from its start) first fail to decode as UTF-8, at the
    offset bytes.decode('utf-8-sig') reports; None: valid."""
    bad = []
    chunks = itertools.chain([head[len(BOM) :] if head.startswith(BOM) else head], iter(lambda: fh.read(HUGE_CHUNK), b""))
    for _ in _decoded(_small(chunks), 0, bad):
        pass
    return bad[0] if bad else None


def _streamed_paragraphs(url: str, bad: int | None) -> Iterator[tuple[str, object]]:
    """text_mode: paragraph for a file over HUGE_RECORD_BYTES, checked whole for invalid UTF-8 first (at `bad`:
    one BadRecord and no paragraph, as a whole-file read gives), then read again in HUGE_CHUNK pieces and split
    as the whole text is, with the same paragraph indices."""
    if bad is not None:
        yield url, BadRecord("invalid_utf8", url, f"invalid UTF-8 at byte {bad}")
        return
    for i, para in enumerate(_paragraph_pieces(_file_chunks(url))):
        if not (para.blank if isinstance(para, StreamedText) else not para or para.isspace()):
            yield f"{url}:paragraph {i}", para


def _text(url: str, mode: str) -> Iterator[tuple[str, object]]:
    with _open_binary(url) as fh:
        raw = _read_at_least(fh, HUGE_RECORD_BYTES + 1)
        streamed = len(raw) > HUGE_RECORD_BYTES  # the document (mode file) or the paragraphs
        if streamed and mode == "paragraph":  # the check pass reads on from here (the file is read twice)
            bad = _utf8_error(raw, fh)
    if streamed:
        del raw
        if mode == "paragraph":
            yield from _streamed_paragraphs(url, bad)
        else:
            yield url, _huge_text(url)
        return
    try:
        text = raw.decode("utf-8-sig")  # without a leading byte order mark
    except UnicodeDecodeError as exc:
        yield url, BadRecord("invalid_utf8", url, f"invalid UTF-8 at byte {exc.start}")
        return
    if mode == "file":
        yield url, text
        return
    for i, para in enumerate(PARAGRAPH_BREAK.split(text)):
        if para.strip():
            yield f"{url}:paragraph {i}", para


_MISSING = object()  # a record without the text field


def _hf(spec: str, cfg: dict) -> Iterator[tuple[str, object]]:
    field = cfg["text_field"]
    for i, value in enumerate(_hf_values(spec[len(HF_PREFIX) :], cfg)):
        where = f"{spec}[{i}]"
        yield where, BadRecord("missing_field", where, f"no '{field}' field") if value is _MISSING else value


def _hf_values(path: str, cfg: dict) -> Iterator[object]:
    """The text field's value (or _MISSING) of each record of a Hugging Face dataset, in order. Read here, in
    bounded memory: a local save_to_disk folder (_saved_values) and, when streaming, local Parquet data files
    (page by page; datasets' own streaming decodes a whole row group at once). The rest through datasets:
    its streaming, or (streaming false) its Arrow cache, memory-mapped."""
    import os

    if os.path.isfile(os.path.join(path, "state.json")) or os.path.isfile(os.path.join(path, "dataset_dict.json")):
        yield from _saved_values(path, cfg)
        return
    import datasets

    field, split = cfg["text_field"], cfg["hf_split"]
    if not cfg["streaming"]:
        ds = datasets.load_dataset(path, cfg["hf_config"], split=split, revision=cfg["hf_revision"])
    else:
        builder = datasets.load_dataset_builder(path, cfg["hf_config"], revision=cfg["hf_revision"])
        files = {str(name): list(found) for name, found in (builder.config.data_files or {}).items()}
        if _local_parquet(builder, files.get(split)):
            for file in files[split]:
                with open(file, "rb") as fh:
                    pf = _parquet_file(fh)
                    if field in pf.schema_arrow.names:
                        yield from _parquet_values(pf, field)
                    else:
                        yield from itertools.repeat(_MISSING, pf.metadata.num_rows)
            return
        ds = builder.as_streaming_dataset(split=split)
    for record in ds:
        yield record[field] if field in record else _MISSING


def _local_parquet(builder, files: list | None) -> bool:
    """datasets would stream these local Parquet files as they are (no filter, column choice or features)."""
    conf = builder.config
    plain = getattr(conf, "filters", None) is None and getattr(conf, "columns", None) is None and conf.features is None
    return builder.name == "parquet" and plain and bool(files) and not any("://" in str(f) for f in files)


def _saved_values(path: str, cfg: dict) -> Iterator[object]:
    """A folder written by datasets' save_to_disk (a Dataset; or a DatasetDict: its `hf_split`), read file by
    file, record batch by record batch, as load_from_disk orders it (which would memory-map the files)."""
    import os

    import pyarrow as pa

    if os.path.isfile(os.path.join(path, "dataset_dict.json")):
        with open(os.path.join(path, "dataset_dict.json")) as fh:
            splits = json.load(fh)["splits"]
        if cfg["hf_split"] not in splits:
            raise ValueError(f"hf:{path}: no split {cfg['hf_split']!r} (data.hf_split; splits: {', '.join(splits)})")
        path = os.path.join(path, cfg["hf_split"])
    with open(os.path.join(path, "state.json")) as fh:
        names = [entry["filename"] for entry in json.load(fh)["_data_files"]]
    field = cfg["text_field"]
    for name in names:
        with open(os.path.join(path, name), "rb") as fh:
            yield from _arrow_values(pa.ipc.open_stream(fh), field)


def records(source: str, cfg: dict, keep=None, stride=None, part=None, tally=None) -> Iterator[tuple[str | None, object]]:
    """(location, text or BadRecord) for every record of one source, in order; records whose index
    `keep` rejects may come unread, as (None, how many in a row). stride, part, tally: see _jsonl."""
    if part is not None and (_compression(source) or not _base_name(source).endswith(JSONL_SUFFIXES)):
        raise ValueError(f"{source}: only a plain JSONL file is read by byte range")
    if source.startswith(HF_PREFIX):
        return _hf(source, cfg)
    name = _base_name(source)
    if name.endswith(JSONL_SUFFIXES):
        return _jsonl(source, cfg["text_field"], keep, stride, part, tally)
    if name.endswith(".parquet"):
        return _parquet(source, cfg["text_field"])
    if name.endswith(TEXT_SUFFIXES):
        return _text(source, cfg["text_mode"])
    raise ValueError(
        f"unsupported data source format: {source} (expected .jsonl/.json[.gz|.zst], .parquet, .txt[.gz|.zst] or hf:<id>)"
    )


def locate(source: str, cfg: dict, record_index: int) -> str | None:
    """Where record `record_index` of `source` is (`file:line` for JSONL), by reading it again (error paths only)."""
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
    part (sources.ByteRange): read only that byte range of a plain JSONL file (its records, numbered as
    in the whole file); the bytes read go to stats.bytes_read.
    stats: a ReadStats, or one per shard behind the same calls (tokenize_job.ShardedStats: `of(record
    index)` is the record's shard's, `skip(BadSource)` counts a broken source in each shard).
    streamed: a record over HUGE_RECORD_BYTES comes as a StreamedText (read in bounded memory), else as a str.
    """
    limit = cfg["max_records_per_source"]
    index = start = 0 if part is None else part.first_record
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
                if not keep(index - 1):
                    continue
                result = check(where, value, cfg)
                mine = stats.of(index - 1)
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
                yield index - 1, result
        except Exception as exc:
            if isinstance(exc, BadRecord) or not is_read_error(exc):
                raise
            raise broken(source, exc, f"{index} records" if index > start else None) from exc
        if not (index if part is None else part.records):  # a range may hold no record; the file must
            raise BadSource("empty_source", source, "holds no records (a 0-byte or blank file?)")
    except BadSource as err:
        if cfg["on_bad_record"] == "fail":
            raise
        stats.skip(err)


def iter_documents(cfg: dict, stats: ReadStats | None = None) -> Iterator[str]:
    """Every usable document of every source (data section `cfg`), in order."""
    stats = stats if stats is not None else ReadStats()
    for source in expand_sources(paths(cfg["sources"])):
        for _, text in documents(source, cfg, stats):
            yield text
