"""Opening a source: local or fsspec, gzip / zstd / bz2 / xz, bytes counted per source; lines of bytes."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator


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
