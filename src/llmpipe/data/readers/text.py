"""Plain text: one document per file, or per paragraph (streamed, a paragraph over the limit spooled)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

from llmpipe.data.readers import limits, opener
from llmpipe.data.readers.huge import StreamedText, _decoded, _small, _Tally
from llmpipe.data.readers.opener import BOM
from llmpipe.data.readers.stats import BadRecord

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
    with opener._open_binary(url) as fh:
        data = _read_at_least(fh, limits.HUGE_CHUNK)
        yield data[len(BOM) :] if data.startswith(BOM) else data
        while data := fh.read(limits.HUGE_CHUNK):
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
        if self.spool is None and self.size + len(data) > limits.HUGE_RECORD_BYTES:
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
    chunks = itertools.chain([head[len(BOM) :] if head.startswith(BOM) else head], iter(lambda: fh.read(limits.HUGE_CHUNK), b""))
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
    with opener._open_binary(url) as fh:
        raw = _read_at_least(fh, limits.HUGE_RECORD_BYTES + 1)
        streamed = len(raw) > limits.HUGE_RECORD_BYTES  # the document (mode file) or the paragraphs
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
