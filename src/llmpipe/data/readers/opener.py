"""Opening a source: local or fsspec, gzip / zstd / bz2 / xz, bytes counted and hashed per source; lines of bytes."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections import Counter
from collections.abc import Iterator

from llmpipe.data.readers.stats import CorruptData


def _path_of(url: str) -> str:
    """What names a source's format: a URL's path, without its query or fragment (`x.jsonl?download=1`)."""
    if "://" not in url:
        return url
    from urllib.parse import urlsplit

    return urlsplit(url).path


def _compression(url: str) -> str | None:
    return {"gz": "gzip", "zst": "zstd", "bz2": "bz2", "xz": "xz"}.get(_path_of(url).rsplit(".", 1)[-1].lower())


def _base_name(url: str) -> str:
    name = _path_of(url).lower()
    return name.rsplit(".", 1)[0] if _compression(url) else name


# Bytes read from storage per source by this process (compressed bytes for .gz / .zst): a tokenize job's
# read accounting (tokenize.py writes it beside its shards, the token store sums it: one read per byte).
SOURCE_BYTES: Counter = Counter()


class _Span:
    """sha256 of bytes [start, end) of a source, read in one run; `data`: those bytes, kept while the run is
    short (_Hashes.KEEP), else None."""

    __slots__ = ("start", "end", "sha", "data")

    def __init__(self, start: int):
        self.start, self.end, self.sha, self.data = start, start, hashlib.sha256(), bytearray()


class _Hashes:
    """sha256 of the bytes read from each source, hashed as they are read, so a source's checksum costs no
    read of its own. A run (reads of one opened file, each where the last ended) makes a span; a short
    run's bytes are kept, so a span can be completed by them (Parquet: its footer, read before the rest)."""

    KEEP = 64 << 10  # a run's bytes are kept while it is no longer than this
    KEEP_TOTAL = 64 << 20  # and while all kept bytes stay under this (past it: read again, counted)

    def __init__(self):
        self.spans: dict[str, list[_Span]] = {}
        self.kept = 0

    def clear(self) -> None:
        self.spans.clear()
        self.kept = 0

    def run(self, url: str, pos: int) -> _Span:
        """The span of a run starting at `pos`."""
        span = _Span(pos)
        self.spans.setdefault(url, []).append(span)
        return span

    def feed(self, span: _Span, data, keep: bool = False) -> None:
        """`keep`: keep these bytes whatever the run's length (still under KEEP_TOTAL)."""
        span.sha.update(data)
        span.end += len(data)
        if span.data is None:
            return
        if (keep or span.end - span.start <= self.KEEP) and self.kept + len(data) <= self.KEEP_TOTAL:
            span.data += data
            self.kept += len(data)
        else:
            self.kept -= len(span.data)
            span.data = None

    def digest(self, url: str, start: int, end: int) -> str:
        """sha256 of bytes [start, end) of local file `url`: from what the readers hashed, the rest read now (a
        reader that stopped early, e.g. max_records_per_source; counted in SOURCE_BYTES). A file no longer
        `end` bytes long raises SourceSizeChanged."""
        if start == end:  # an empty byte range (more shards than records there)
            return hashlib.sha256().hexdigest()
        spans = self.spans.get(url, [])
        best = max((s for s in spans if s.start == start and s.end <= end), key=lambda s: s.end, default=None)
        at, h = (best.end, best.sha.copy()) if best else (start, hashlib.sha256())
        while at < end and (piece := next((s for s in spans if s.data and s.start == at), None)):
            h.update(piece.data[: end - at])
            at += min(len(piece.data), end - at)
        if at < end:
            with open(url.removeprefix("file://"), "rb") as fh:
                fh.seek(at)
                while at < end and (data := fh.read(min(1 << 20, end - at))):
                    SOURCE_BYTES[url] += len(data)
                    h.update(data)
                    at += len(data)
        if at != end or any(s.start == start and s.end > end for s in spans):  # shrank, grew
            raise SourceSizeChanged(_changed(url, end, start))
        return h.hexdigest()

    @staticmethod
    def check_size(url: str, size: int) -> None:
        """SourceSizeChanged unless local file `url` is `size` bytes now: a reader that stops early (Parquet at
        its footer, max_records_per_source) never reaches bytes a grown file added."""
        if os.stat(url.removeprefix("file://")).st_size != size:
            raise SourceSizeChanged(_changed(url, size, 0))


def _changed(url: str, end: int, start: int) -> str:
    return (
        f"data source {url} changed after get-data recorded its size ({end} bytes, range from {start}): "
        "run get-data again (Snakemake does when a corpus file changes)"
    )


class SourceSizeChanged(RuntimeError):
    """A source whose size changed after get-data recorded it."""


SOURCE_HASHES = _Hashes()


class _Counted:
    """A binary file whose reads add to SOURCE_BYTES[url] and SOURCE_HASHES; everything else is the file's own."""

    def __init__(self, fh, url: str):
        self._fh, self._url, self._pos, self._span = fh, url, fh.tell(), None
        self._hashed = "://" not in url or url.startswith("file://")  # local files (remote ones: ETag, get-data)

    def _count(self, data, keep: bool = False) -> None:
        SOURCE_BYTES[self._url] += len(data)
        if self._hashed:
            if self._span is None or self._span.end != self._pos:  # a read not where the last one ended: a new run
                self._span = SOURCE_HASHES.run(self._url, self._pos)
            SOURCE_HASHES.feed(self._span, data, keep)
        self._pos += len(data)

    def read_kept(self, size: int) -> bytes:
        """A read whose bytes are kept for the checksum whatever their length: Parquet's footer, read first,
        hashed last (the reader holds it anyway, parsed)."""
        data = self._fh.read(size)
        if data:
            self._count(data, keep=True)
        return data

    def read(self, size: int = -1) -> bytes:
        data = self._fh.read(size)
        if data:
            self._count(data)
        return data

    def readinto(self, buf) -> int:
        n = self._fh.readinto(buf)
        if n:
            self._count(memoryview(buf).cast("B")[:n])
        return n

    read_through = False  # True: a seek forward reads the bytes it passes (Parquet: its other columns), so
    # every byte is read once, in order, and hashed on the way

    def seek(self, offset: int, whence: int = 0) -> int:
        target = {0: offset, 1: self._pos + offset}.get(whence)
        if self.read_through and target is not None and target > self._pos:
            while self._pos < target and self.read(min(1 << 20, target - self._pos)):
                pass
            return self._pos
        self._pos = self._fh.seek(offset, whence)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def __getattr__(self, name: str):
        return getattr(self._fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._fh.close()


@contextlib.contextmanager
def _open_raw(url: str):
    """A local path by the builtin open (fsspec's import costs every job ~0.08 s), anything else by fsspec;
    the bytes read are counted in SOURCE_BYTES (compressed bytes for a compressed source)."""
    if "://" not in url:
        with open(url, "rb") as fh:
            yield _Counted(fh, url)
        return
    import fsspec

    with fsspec.open(url, "rb") as fh:
        yield _Counted(fh, url)


@contextlib.contextmanager
def _open_binary(url: str) -> Iterator:
    """A line-iterable binary stream of `url`, decompressed by its suffix."""
    comp = _compression(url)
    with _open_raw(url) as raw:
        if comp is None:
            yield raw
        elif comp == "gzip":  # ISA-L's gzip reader: same bytes as the gzip module, ~2.5x faster
            from isal import igzip

            with igzip.IGzipFile(fileobj=raw, mode="rb") as fh:
                yield _Salvaged(fh, url)
        else:
            yield _Streams(raw, comp)


class _Salvaged:
    """A gzip reader (ISA-L's) that, when a read fails part way (a truncated or damaged member, bytes after the
    last member that are not gzip), first hands out what came before the break, then raises: IGzipFile gives
    nothing back from a read that fails, which lost up to a read (1 MiB) of complete records. What came before
    is found by reading the file again (only then: _salvage)."""

    def __init__(self, fh, url: str):
        self._fh, self._url, self._pos, self._error = fh, url, 0, None

    def read(self, size: int = -1) -> bytes:
        if self._error is not None:
            raise self._error
        try:
            data = self._fh.read(size)
        except Exception as exc:
            from llmpipe.data.readers.stats import is_read_error

            if not is_read_error(exc):
                raise
            rest, self._error = _salvage(self._url, self._pos)
            self._error = self._error or exc  # no break found again (a read error of the file): the reader's own
            if not rest:
                raise self._error from exc
            data = rest
        self._pos += len(data)
        return data

    def __getattr__(self, name: str):
        return getattr(self._fh, name)


SALVAGE_FEED = 4096  # compressed bytes per step when salvaging: damaged deflate data loses at most one step's output


def _salvage(url: str, skip: int) -> tuple[bytes, Exception | None]:
    """The decompressed bytes of gzip source `url` past the first `skip`, up to where the stream breaks, and an
    error saying how it breaks, None if it does not (read again from the start, counted)."""
    import gzip

    from isal import isal_zlib

    out, seen, done, d = [], 0, 0, isal_zlib.decompressobj(wbits=31)
    member = 0  # where the member being read starts in the decompressed bytes
    with _open_raw(url) as raw:
        data = b""
        while True:
            if d.eof:  # a member ended: what follows must be another member
                data, d, member = d.unused_data + data, isal_zlib.decompressobj(wbits=31), seen
                data += raw.read(2 - len(data)) if len(data) < 2 else b""
                if not data:
                    return b"".join(out), None
                if data[:2] != b"\x1f\x8b":
                    error = gzip.BadGzipFile(f"bytes after the gzip member ending at byte {done} are not gzip data")
                    return b"".join(out), error
            if not data and not (data := raw.read(SALVAGE_FEED)):
                return b"".join(out), EOFError(f"the file ends inside a gzip member, at byte {done} (truncated?)")
            try:
                piece = d.decompress(data)
            except isal_zlib.error as exc:  # damaged data or checksum inside the member begun at `member`
                if member < skip:
                    return b"", CorruptData(f"the gzip member from byte {done} on is damaged ({exc}): {_SUSPECT}")
                return b"".join(out)[: member - skip], exc  # the whole members before it only
            done += len(data) - len(d.unused_data)
            data = b""
            if seen + len(piece) > skip:
                out.append(piece[max(0, skip - seen) :])
            seen += len(piece)


_SUSPECT = "the records read from it before may be damaged too, so it cannot be skipped; fetch the file again"


def zstd_module():
    """The standard library's zstd (Python 3.14: compression.zstd), or its backport (backports.zstd) before:
    the bz2 / lzma decompressor API, whose max_length bounds each piece's size."""
    try:
        from compression import zstd
    except ImportError:
        from backports import zstd
    return zstd


MAGIC = {"zstd": b"\x28\xb5\x2f\xfd", "bz2": b"BZh", "xz": b"\xfd7zXZ\x00"}  # how each stream starts


class _Streams:
    """Decompressed bytes of a zstd / bz2 / xz file of one or more streams (zstd: frames). Unlike zstandard's
    stream_reader (which ends without a word inside a cut frame) and BZ2File / LZMAFile (which end without a
    word at bytes after a stream that are not another one, and lose a whole read's bytes when part of it
    fails), it hands out each piece as it is made (at most OUT bytes, however compressible the data), then:
    a file cut inside a stream raises EOFError; bytes after a stream that do not start another one raise
    OSError saying so (xz's zero stream padding aside); a stream damaged after some of its bytes were handed
    out raises CorruptData (they may be damaged too); one damaged before that, its own error."""

    FEED, OUT = 64 << 10, 1 << 20

    def __init__(self, raw, kind: str, size: int = 1 << 20):
        self.raw, self.kind, self.size, self.error = raw, kind, size, None
        if kind == "zstd":
            zstd = zstd_module()
            self.bad, self.new = zstd.ZstdError, zstd.ZstdDecompressor
        elif kind == "bz2":
            import bz2

            self.bad, self.new = OSError, bz2.BZ2Decompressor
        else:
            import lzma

            self.bad, self.new = lzma.LZMAError, lambda: lzma.LZMADecompressor(lzma.FORMAT_XZ)
        self.pieces = self._pieces()

    def _pieces(self):
        dobj, streams, head, made, done = self.new(), 1, b"", 0, 0  # head: the stream's first bytes; made: its output
        while data := self.raw.read(self.size):
            for at in range(0, len(data), self.FEED):
                chunk = data[at : at + self.FEED]
                while chunk or (not dobj.eof and not dobj.needs_input):
                    if dobj.eof:
                        if self.kind == "xz":  # stream padding: zero bytes between and after streams
                            done += len(chunk) - len(chunk := chunk.lstrip(b"\0"))
                            if not chunk:
                                break
                        dobj, streams, head, made = self.new(), streams + 1, b"", 0
                    head += chunk[: 8 - len(head)]
                    try:
                        out = dobj.decompress(chunk, max_length=self.OUT)
                    except self.bad as exc:
                        raise self._broken(exc, streams, head, made, done) from exc
                    rest = dobj.unused_data if dobj.eof else b""
                    done += len(chunk) - len(rest)
                    chunk = rest
                    if out:
                        made += len(out)
                        yield out
        if head and not dobj.eof:
            if streams > 1 and not made and not head.startswith(MAGIC[self.kind][: len(head)]):
                raise self._not_a_stream(done, "too short")
            raise EOFError(f"{self.kind} stream ended inside a stream (truncated file?)")

    def _not_a_stream(self, done: int, why) -> OSError:
        return OSError(f"bytes after the {self.kind} stream ending at byte {done} are not {self.kind} data ({why})")

    def _broken(self, exc, streams: int, head: bytes, made: int, done: int) -> OSError:
        if made:  # this stream's bytes were handed out: they may be damaged too
            return CorruptData(f"the {self.kind} stream from byte {done} on is damaged ({exc}): {_SUSPECT}")
        if streams > 1 and not head.startswith(MAGIC[self.kind][: len(head)]):
            return self._not_a_stream(done, exc)
        return exc

    def read(self, size: int = -1) -> bytes:
        """The next piece (whatever `size`: callers take any length), b"" at the end; a break is raised at
        the read after the last piece before it."""
        if self.error is not None:
            raise self.error
        try:
            return next(self.pieces, b"")
        except Exception as exc:
            self.error = exc
            raise


BOM = b"\xef\xbb\xbf"
