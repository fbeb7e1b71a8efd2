"""Plain text: one document per file, or per paragraph (streamed, a paragraph over the limit spooled)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

from llmpipe.data.readers import limits, opener
from llmpipe.data.readers.huge import StreamedText, _decoded, _small, _Tally, _utf8_cut
from llmpipe.data.readers.opener import BOM
from llmpipe.data.readers.stats import BadRecord

# A paragraph break is an empty line: two line ends in a row, each LF, CRLF or CR (a CR followed by LF is one
# line end, CRLF). Matched on UTF-8 bytes (CR, LF never occur inside a sequence), the first line end
# written out as alternatives (each starts with CR or LF, which sre scans for).
_BREAK_BYTES = re.compile(rb"\r\n(?:\r\n|\r|\n)|\r(?!\n)(?:\r\n|\r|\n)|\n(?:\r\n|\r|\n)")

BREAK_READS = 4  # bytes a _BREAK_BYTES match attempt at p reads at most (p .. p + 3)


def _read_at_least(fh, n: int) -> bytes:
    """Up to `n` bytes of `fh` (fewer only at its end: some streams hand out less per read)."""
    out, have = [], 0
    while have < n and (data := fh.read(n - have)):
        out.append(data)
        have += len(data)
    return b"".join(out)


def _huge_text(url: str, chunks: Iterator[bytes], at: int = 0) -> object:
    """A text file too long to hold as one document (`chunks`: its bytes from file offset `at`, after a leading
    byte order mark): a StreamedText of its text, spooled to a temporary file as the source is read, once (as a
    huge JSONL record's), or BadRecord (invalid UTF-8, at the file offset of its first bad byte)."""
    tally, bad = _Tally(True), []
    for text in _decoded(_small(chunks), at, bad):
        tally.add(text)
    if bad:
        tally.fh.close()
        return BadRecord("invalid_utf8", url, f"invalid UTF-8 at byte {bad[0]}")
    return tally.text()


class _Piece:
    """The bytes of the paragraph being read from byte `at` of the file: held up to HUGE_RECORD_BYTES, then
    spooled (decoded, counted); after invalid UTF-8 only counted."""

    def __init__(self, at: int):
        self.at, self.held, self.size, self.spool = at, [], 0, None
        self.fed, self.carry, self.bad = 0, b"", None  # spool: bytes decoded, an incomplete sequence, bad offset

    def add(self, data: bytes) -> None:
        if self.spool is None and self.size + len(data) > limits.HUGE_RECORD_BYTES:
            self.spool, held, self.held = _Tally(True), self.held, []
            for piece in held:
                self._feed(piece)
        if self.spool is not None:
            self._feed(data)
        elif data:
            self.held.append(data)
        self.size += len(data)

    def _feed(self, data: bytes) -> None:
        for piece in _small([data]):
            if self.bad is not None:
                return
            piece = self.carry + piece
            cut = _utf8_cut(piece)
            try:
                self.spool.add(piece[:cut].decode("utf-8"))
            except UnicodeDecodeError as exc:
                self.bad = self.at + self.fed + exc.start
                return
            self.fed, self.carry = self.fed + cut, piece[cut:]

    def end(self, data: bytes) -> str | StreamedText | int:
        """The paragraph, ending with `data`: its text, or the file offset of its first invalid UTF-8 byte."""
        self.add(data)
        if self.spool is None:
            try:
                return b"".join(self.held).decode("utf-8")
            except UnicodeDecodeError as exc:
                return self.at + exc.start
        if self.carry and self.bad is None:  # a sequence cut by the paragraph's end
            self.bad = self.at + self.fed
        return self.spool.text() if self.bad is None else self.bad


def _paragraph_pieces(chunks: Iterator[bytes], at: int = 0) -> Iterator[str | StreamedText | int]:
    """_BREAK_BYTES.split of the whole of `chunks` (bytes from file offset `at`), piece by piece, decoded: a str,
    a StreamedText for a piece over HUGE_RECORD_BYTES, or the file offset of a piece's first invalid UTF-8 byte.
    A break is taken once BREAK_READS bytes from its start are in: the regex then matches there as it does
    on the whole text (a break is CR / LF bytes alone, which never occur inside a UTF-8 sequence)."""
    piece, buf = _Piece(at), b""  # buf: the bytes where a break may yet start (< BREAK_READS), then a chunk
    for chunk in chunks:
        buf += chunk
        start, final = 0, len(buf) - BREAK_READS + 1  # a match starting before `final` is the whole text's
        for m in _BREAK_BYTES.finditer(buf):
            if m.start() >= final:
                break
            yield piece.end(buf[start : m.start()])
            piece, start = _Piece(at + m.end()), m.end()
        keep = max(start, final)
        piece.add(buf[start:keep])
        buf, at = buf[keep:], at + keep
    start = 0
    for m in _BREAK_BYTES.finditer(buf):  # the rest: the breaks in it, then the last piece
        yield piece.end(buf[start : m.start()])
        piece, start = _Piece(at + m.end()), m.end()
    yield piece.end(buf[start:])


def _paragraphs(url: str, chunks: Iterator[bytes]) -> Iterator[tuple[str, object]]:
    """text_mode paragraph, in one pass over the file's bytes: its paragraphs, blank ones left out; one with
    invalid UTF-8 is a BadRecord naming it and the file offset of its first invalid byte."""
    chunks, head = iter(chunks), b""
    while len(head) < len(BOM) and (more := next(chunks, None)) is not None:  # enough to see a byte order mark
        head += more
    skip = len(BOM) if head.startswith(BOM) else 0
    for i, para in enumerate(_paragraph_pieces(itertools.chain([head[skip:]], chunks), skip)):
        where = f"{url}:paragraph {i}"
        if isinstance(para, int):
            yield where, BadRecord("invalid_utf8", where, f"invalid UTF-8 at byte {para}")
        elif not (para.blank if isinstance(para, StreamedText) else not para or para.isspace()):
            yield where, para


def _pieces_of(data: bytes) -> Iterator[bytes]:
    for at in range(0, len(data), limits.HUGE_CHUNK):
        yield data[at : at + limits.HUGE_CHUNK]


def _text(url: str, mode: str) -> Iterator[tuple[str, object]]:
    with opener._open_binary(url) as fh:
        if mode == "paragraph":  # one pass over the file's bytes, whatever its size; a read that breaks (a
            # truncated file) stops it after the paragraphs before the break
            yield from _paragraphs(url, iter(lambda: fh.read(limits.HUGE_CHUNK), b""))
            return
        raw = _read_at_least(fh, limits.HUGE_RECORD_BYTES + 1)
        skip = len(BOM) if raw.startswith(BOM) else 0  # offsets in messages are the file's, as in paragraph mode
        if len(raw) > limits.HUGE_RECORD_BYTES:  # the document streamed, from the bytes read so far on
            head, raw = _pieces_of(raw[skip:]), None
            doc = _huge_text(url, itertools.chain(head, iter(lambda: fh.read(limits.HUGE_CHUNK), b"")), skip)
    if raw is None:
        yield url, doc
        return
    try:
        yield url, raw.decode("utf-8-sig")  # without a leading byte order mark
    except UnicodeDecodeError as exc:  # exc.start counts from after the mark
        yield url, BadRecord("invalid_utf8", url, f"invalid UTF-8 at byte {skip + exc.start}")
