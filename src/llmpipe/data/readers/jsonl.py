"""JSONL: line by line, strided for many shards, or by byte range (split_points, get_data's ranges)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import orjson

from llmpipe.data.readers import limits, opener
from llmpipe.data.readers.huge import WHITESPACE, HugeLine, _huge_json, _lines, loads_json
from llmpipe.data.readers.opener import BOM, _compression
from llmpipe.data.readers.stats import BadRecord, BadSource, broken, is_read_error


def _json_array(url: str) -> BadSource:
    """A .json file holding one array of records, not JSON Lines: one source-level error, not a count of
    bad lines that matches no number of documents."""
    return BadSource("unreadable_source", url, "is a JSON array, not JSON Lines (one object per line; e.g. jq -c '.[]')")


def _array_check(url: str, text_field: str):
    """The check of a source's first record line, made by every reader of the source whichever records it
    keeps (so every shard, however grouped into jobs, refuses or skips the source alike): a line `[` (a
    pretty-printed array) or one line parsing as an array of records raises _json_array."""

    def check(raw) -> None:
        if isinstance(raw, HugeLine) or raw.lstrip()[:1] != b"[":
            return
        if raw.strip() == b"[":
            raise _json_array(url)
        try:
            record = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return  # a bad record, judged as such by the shard that keeps it
        if isinstance(record, list) and any(isinstance(x, dict) and text_field in x for x in record[:8]):
            raise _json_array(url)

    return check


def _each_line(lines, keep, pos: list[int], lineno: int = 0, first_record=None) -> Iterator[tuple[int | None, object]]:
    """(line number, raw line) per record of `lines` whose index `keep` accepts, else (None, 1).
    pos: [lines, records] reached, kept up to date (error messages name them); first_record(raw): called on the
    source's first record, kept or not."""
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
        if pos[1] == 1 and first_record is not None:
            first_record(raw)
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


def _strided_lines(fh, keep, stride: tuple[int, int], pos: list[int], first_record=None):
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
        chunk = fh.read(limits.STRIDE_BLOCK)
        buf += chunk
        # whole lines: up to the last LF, or a CR that is not the last byte (an LF may follow it); at the end all
        cut = max(buf.rfind(b"\n"), buf.rfind(b"\r", 0, len(buf) - 1)) + 1 if chunk else len(buf)
        if not cut:
            if not chunk:
                return
            if len(buf) > limits.HUGE_RECORD_BYTES:  # one line too long to hold: its record, if any, goes on as a stream
                huge, buf = HugeLine(buf, fh, limits.STRIDE_BLOCK), bytearray()
                yield from _each_line([huge], keep, pos, pos[0], first_record)
                buf += huge.finish()  # the bytes read past its end
                first = False
            continue
        block = bytes(buf[:cut])
        del buf[:cut]
        if first or pos[1] == 0 or b"\r" in block:  # line by line up to the first record (first_record)
            yield from _each_line(block.splitlines(keepends=True), keep, pos, pos[0], first_record)
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


def split_points(url: str, n: int) -> tuple[list[int], int]:
    """Where to cut a plain (uncompressed) JSONL file into `n` byte ranges of about equal size: the first line
    start at or after each k * size / n (a line starts at 0, after an LF, or after a CR that no LF follows),
    then the size; the bytes read to find them: from each target to the next line end, in reads growing
    from 256 bytes to CUT_READ (the rest of a line a cut, however many cuts; none for a target the last cut's
    line already passed)."""
    with opener._open_binary(url) as fh:
        size = fh.seek(0, 2)
        cuts, read = [0], 0
        for k in range(1, n):
            target = k * size // n
            if target <= cuts[-1]:  # inside the line the last cut skipped, or at it
                cuts.append(cuts[-1])
                continue
            fh.seek(target - 1)  # the byte before the target says whether a line starts there
            at, carry, block = target - 1, b"", 256  # carry: a CR last read (is an LF next?)
            while True:
                new = fh.read(block)
                read, block = read + len(new), min(block * 2, CUT_READ)
                data = carry + new
                end = len(data) - 1 if new and data.endswith(b"\r") else len(data)
                m = _LINE_START.search(data, 0, end)
                if m or not new:
                    cuts.append(at + m.end() if m else size)
                    break
                at, carry = at + end, data[end:]
        return cuts + [size], read


def has_record(url: str) -> tuple[bytes, int]:
    """(the first byte of the file's first line that is not blank, b"" if none; the bytes read to find out: up
    to that byte, in reads growing from 256 bytes to CUT_READ)."""
    read, block = 0, 256
    try:
        with opener._open_binary(url) as fh:
            while data := fh.read(block):
                found = _TEXT.search(data, len(BOM) if read == 0 and data.startswith(BOM) else 0)
                read, block = read + len(data), min(block * 2, CUT_READ)
                if found:
                    return found.group(), read
    except OSError:  # unreadable: not cut (its readers name it)
        pass
    return b"", read


def cuttable(first: bytes) -> bool:
    """Whether a file whose first record line starts with `first` (has_record) may be cut into byte ranges:
    one holding a line, not an array's `[` (only the range at its start would see that line, and every shard
    must refuse or skip such a source alike: _array_check)."""
    return bool(first) and first != b"["


CUT_READ = 1 << 16  # split_points' largest read: what it reads past a line end is less than this
_LINE_START = re.compile(rb"\n|\r(?!\n)")  # the line end before a line start
# a byte of a line that is not blank; a BOM's bytes count as blank (a file of them is left uncut: always safe)
_TEXT = re.compile(rb"[^ \t\n\r\x0b\x0c\xef\xbb\xbf]")


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


class Where(str):
    """Where a record of a file read by byte range is ("file:byte N"), carrying N as `offset`: the byte offset
    of its line, the record's identity there (sources.ByteRange)."""

    offset: int

    @classmethod
    def at(cls, url: str, offset: int) -> Where:
        where = cls(f"{url}:byte {offset}")
        where.offset = offset
        return where


def _offset_lines(
    ranged: _Bounded, part, keep, url: str, pos: list[int], first_record=None
) -> Iterator[tuple[Where | None, object]]:
    """(location, raw line) per record of byte range `part` (sources.ByteRange, starting at a line start) read
    through `ranged`, or (None, 1) for one whose offset `keep` rejects; blank lines are no record. pos[0]: the
    offset of the line being read (errors)."""
    at = part.start
    for raw in _lines(ranged):
        pos[0] = line_at = at
        huge = isinstance(raw, HugeLine)
        if huge:
            if line_at == 0:
                raw.strip_bom()
            record = not raw.blank()
        else:
            at += len(raw)
            if line_at == 0 and raw.startswith(BOM):
                raw = raw[len(BOM) :]
            record = raw and not raw.isspace()
        if record:
            if line_at == 0 and first_record is not None:  # only the range at the file's start holds it
                first_record(raw)
            if keep is not None and not keep(line_at):
                yield None, 1
            else:
                yield Where.at(url, line_at), raw
        if huge:  # its consumer has read what it needed: the next line starts where its end is
            rest = raw.finish()
            at = part.end - ranged.left - len(rest)


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
    uncompressed file, `keep` then taking each record's byte offset (its location a Where); `tally` counts the bytes."""
    pos, first_record = [0, 0], _array_check(url, text_field)
    try:
        with opener._open_binary(url) as fh:
            if part is not None:
                ranged = _byte_range(fh, url, part, tally if tally is not None else {})
                lines = _offset_lines(ranged, part, keep, url, pos, first_record)
            elif (
                stride is not None
                and stride[1] >= limits.STRIDE_MIN
                and keep is not None
                and limits.STRIDED_SCAN
                and not _compression(url)
            ):
                lines = _strided_lines(fh, keep, stride, pos, first_record)
            else:
                lines = _each_line(_lines(fh), keep, pos, first_record=first_record)
            for lineno, raw in lines:
                if lineno is None:
                    yield None, raw
                    continue
                where = lineno if isinstance(lineno, Where) else f"{url}:{lineno}"
                if isinstance(raw, HugeLine):
                    yield where, _huge_json(raw, text_field, where)
                    continue
                try:
                    record = loads_json(raw)  # validates UTF-8 too
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
        raise broken(url, exc, f"line {pos[0]}, {pos[1]} records" if part is None else f"byte {pos[0]}") from exc
