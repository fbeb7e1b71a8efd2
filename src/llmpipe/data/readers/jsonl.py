"""JSONL: line by line, strided for many shards, or by byte range (split_points, get_data's ranges)."""

from __future__ import annotations

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
        chunk = fh.read(limits.STRIDE_BLOCK)
        buf += chunk
        # whole lines: up to the last LF, or a CR that is not the last byte (an LF may follow it); at the end all
        cut = max(buf.rfind(b"\n"), buf.rfind(b"\r", 0, len(buf) - 1)) + 1 if chunk else len(buf)
        if not cut:
            if not chunk:
                return
            if len(buf) > limits.HUGE_RECORD_BYTES:  # one line too long to hold: its record, if any, goes on as a stream
                huge, buf = HugeLine(buf, fh, limits.STRIDE_BLOCK), bytearray()
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
    with opener._open_binary(url) as fh:
        size = fh.seek(0, 2)
        fh.seek(0)
        targets = [k * size // n for k in range(1, n)]
        out = [(0, 0, 1)]
        pos = [0, 0]  # lines, records before the block
        at, buf, first = 0, bytearray(), True  # at: the block's byte offset
        while True:
            chunk = fh.read(limits.STRIDE_BLOCK)
            buf += chunk
            # whole lines: up to the last LF, or a CR that is not the last byte (an LF may follow it)
            cut = max(buf.rfind(b"\n"), buf.rfind(b"\r", 0, len(buf) - 1)) + 1 if chunk else len(buf)
            if not cut:
                if not chunk:
                    break
                if len(buf) > limits.HUGE_RECORD_BYTES:  # one line too long to hold: classified as it streams
                    held, base, counted = len(buf), pos[0], _Bounded(fh, 1 << 62, {}, url)
                    huge = HugeLine(buf, counted, limits.STRIDE_BLOCK)  # takes buf's bytes
                    if any(True for _ in _each_line([huge], None, pos, base)):  # a record at `at`
                        while targets and targets[0] <= at:
                            out.append((at, pos[1] - 1, base + 1))
                            targets.pop(0)
                    rest = huge.finish()
                    at += held + counted.tally[url] - len(rest)  # the line and its end
                    buf, first = bytearray(rest), False
                continue
            block = bytes(buf[:cut])
            del buf[:cut]
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
        with opener._open_binary(url) as fh:
            if part is not None:
                ranged = _byte_range(fh, url, part, tally if tally is not None else {})
                lines = _each_line(_lines(ranged), keep, pos, pos[0])
            elif (
                stride is not None
                and stride[1] >= limits.STRIDE_MIN
                and keep is not None
                and limits.STRIDED_SCAN
                and not _compression(url)
            ):
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
                    record = loads_json(raw)  # validates UTF-8 too
                except orjson.JSONDecodeError as exc:
                    if lineno == 1 and raw.strip() == b"[":  # a pretty-printed array
                        raise _json_array(url) from None
                    try:
                        raw.decode("utf-8")
                    except UnicodeDecodeError as uexc:
                        yield where, BadRecord("invalid_utf8", where, f"invalid UTF-8 at byte {uexc.start}")
                        continue
                    yield where, BadRecord("bad_json", where, f"not valid JSON ({exc.msg})")
                    continue
                if lineno == 1 and isinstance(record, list) and any(isinstance(x, dict) and text_field in x for x in record[:8]):
                    raise _json_array(url)
                if not isinstance(record, dict) or text_field not in record:
                    yield where, BadRecord("missing_field", where, f"no '{text_field}' field")
                    continue
                yield where, record[text_field]
    except Exception as exc:
        if isinstance(exc, BadRecord) or not is_read_error(exc):
            raise
        raise broken(url, exc, f"line {pos[0]}, {pos[1]} records") from exc
