"""Records too long to hold. A line (JSONL record) or text file longer than limits.HUGE_RECORD_BYTES is
read in chunks of limits.HUGE_CHUNK bytes. A JSONL record is scanned once (_JsonScan): everything but its
long strings is kept (the "skeleton", which orjson then parses, so bad JSON, a missing or non-string field
are judged by orjson as for any record), its long strings are decoded piece by piece (json.loads of
segments cut between escapes) and the text field's value is spooled to an anonymous temporary file. The
document is then a StreamedText: what check() needs, worked out while reading, and its text in chunks,
read again for each use."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator

import orjson

from llmpipe.data.readers import limits
from llmpipe.data.readers.opener import BOM
from llmpipe.data.readers.stats import BadRecord


def _lines(fh, size: int | None = None) -> Iterator[bytes | HugeLine]:
    """The lines of a binary stream ending in LF, CRLF or CR (universal newlines, as Python's text
    mode and editors count them; JSON never holds a raw CR inside a string), streamed. A line found
    longer than HUGE_RECORD_BYTES comes as a HugeLine (read on from the stream by its consumer)."""
    size = size or limits.LINE_CHUNK
    rest = b""  # the start of a line not ended yet, or ended by a CR that an LF may follow
    while chunk := fh.read(size):
        # one copy to join the chunk to the rest, one to split it (splitlines cuts at LF, CRLF and CR)
        lines = (rest + chunk if rest else chunk).splitlines(keepends=True)
        rest = b"" if lines[-1].endswith(b"\n") else lines.pop()
        yield from lines
        if len(rest) > limits.HUGE_RECORD_BYTES:  # a line too long to hold: handed out as a stream (HugeLine)
            huge = HugeLine(bytearray(rest), fh, size)
            yield huge
            lines = huge.finish().splitlines(keepends=True)  # the bytes read past its end
            rest = b"" if not lines or lines[-1].endswith(b"\n") else lines.pop()
            yield from lines
    if rest:
        yield rest


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


def _small(chunks) -> Iterator[bytes]:
    """`chunks` cut into SMALL_PIECE pieces. Decoding 1 MiB at a time into short-lived str made glibc's heap
    creep (peak RSS +8 MB from 30 to 300 MB of text read); allocations this small are reused."""
    for chunk in chunks:
        for at in range(0, len(chunk), limits.SMALL_PIECE):
            yield chunk[at : at + limits.SMALL_PIECE]


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
    while data := fh.read(limits.HUGE_CHUNK):
        if text := dec.decode(data):
            yield text
    if text := dec.decode(b"", final=True):
        yield text


_SURROGATE = re.compile("[\ud800-\udfff]")

_STRUCTURE = re.compile(r"[{}\[\]:,]")

_HIGH_ESCAPE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}")

# A streamed string in the skeleton: the JSON escape of a NUL, a random key per record (so no string of the
# record itself can equal it) and the string's number.
_PLACEHOLDER = "\\u0000llmpipe-huge-{}-{}"


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
        self.key = secrets.token_hex(8)

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
            if final or (self.long is None and len(buf) - pos <= limits.LONG_STRING):
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
            self.error = _orjson_says('"' + raw + '"') or getattr(exc, "msg", str(exc))
            return
        if _SURROGATE.search(text):  # a lone surrogate escape (segments never split a pair): orjson rejects it
            self.error = _orjson_says('"' + raw + '"') or "lone surrogate in string"
            return
        self.long.add(text)

    def _end_long(self) -> None:
        name = _PLACEHOLDER.format(self.key, self.streamed)
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
            record = loads_json("".join(self.skel))
        except orjson.JSONDecodeError as exc:
            return BadRecord("bad_json", where, f"not valid JSON ({exc.msg})")
        if not isinstance(record, dict) or self.field not in record:
            return BadRecord("missing_field", where, f"no '{self.field}' field")
        value = record[self.field]
        if isinstance(value, str) and value in self.spools:
            return self.spools[value].text()
        return value


def _not_json(name: str):
    raise ValueError(f"{name} is not JSON")


def _orjson_says(raw: str) -> str | None:
    """orjson's message on a string segment: the one it gives for the whole record (a held line's), so a
    shard's skip messages do not depend on whether the line was held or streamed (its grouping)."""
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return exc.msg
    return None


def loads_json(raw: bytes | str) -> object:
    """orjson.loads, and for a number beyond a double's range (1e999: valid JSON, which orjson refuses)
    Python's json (it reads +-inf, and integers of any size); NaN / Infinity literals and lone surrogates
    stay refused with orjson's message. Python's json runs only after orjson has refused the record."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "infinity" not in exc.msg:  # orjson: "number is infinity when parsed as double"
            raise
        try:
            record = json.loads(raw, parse_constant=_not_json)
            json.dumps(record, ensure_ascii=False).encode()  # a str with a lone surrogate: refused, as orjson does
        except (ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
            raise exc from None
        return record


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
