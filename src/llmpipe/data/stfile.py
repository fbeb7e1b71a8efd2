"""Write a safetensors file whose tensors come from files on disk, streaming (constant memory), or finish
one whose first tensor was written in place after room for the header (finish_in_place: no copy).

The format (8-byte little-endian header length, JSON header padded to 8 bytes, then the tensors'
bytes back to back) is read back with the safetensors library itself.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np

from llmpipe.io import WriteOnce

DTYPES = {np.dtype(np.uint16): "U16", np.dtype(np.uint32): "U32", np.dtype(np.int64): "I64", np.dtype(np.int32): "I32"}


Source = Path | np.ndarray | tuple[Path, int, int]  # a raw little-endian file, an array, or (file, offset, bytes)


def _nbytes(data: Source, dtype: np.dtype) -> int:
    if isinstance(data, tuple):
        return data[2]
    return Path(data).stat().st_size if isinstance(data, Path) else np.asarray(data, dtype).nbytes


def _header(tensors: dict[str, tuple[np.dtype, Source]], metadata: dict[str, str]) -> bytes:
    header, offset = {}, 0
    for name, (dtype, data) in tensors.items():
        dtype = np.dtype(dtype)
        nbytes = _nbytes(data, dtype)
        if nbytes % dtype.itemsize:
            raise ValueError(f"{name}: {nbytes} bytes is not a whole number of {dtype}")
        header[name] = {"dtype": DTYPES[dtype], "shape": [nbytes // dtype.itemsize], "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = metadata
    return json.dumps(header, separators=(",", ":")).encode()


def _put(out, dtype: np.dtype, data: Source) -> None:
    if isinstance(data, tuple):
        path, at, nbytes = data
        with open(path, "rb") as src:
            src.seek(at)
            while nbytes:
                block = src.read(min(nbytes, 1 << 22))
                if not block:
                    raise ValueError(f"{path}: ends before byte {at + data[2]}")
                out.write(block)
                nbytes -= len(block)
    elif isinstance(data, Path):
        with open(data, "rb") as src:
            shutil.copyfileobj(src, out, 1 << 22)
    else:
        out.write(np.ascontiguousarray(data, dtype=np.dtype(dtype).newbyteorder("<")).tobytes())


def write(path: str | Path, tensors: dict[str, tuple[np.dtype, Source]], metadata: dict[str, str]) -> None:
    """tensors: name -> (dtype, a raw little-endian file, an array, or a byte range of a file); 1-D only."""
    blob = _header(tensors, metadata)
    blob += b" " * (-len(blob) % 8)
    with WriteOnce(path, keep=True) as out:  # a token-store shard: pack reads it next
        out.write(struct.pack("<Q", len(blob)))
        out.write(blob)
        for dtype, data in tensors.values():
            _put(out, dtype, data)


def finish_in_place(path: str | Path, room: int, tensors: dict[str, tuple[np.dtype, Source]], metadata: dict[str, str]) -> bool:
    """Complete a file whose first tensor's bytes already lie at byte `room` with nothing after them (written
    there by the caller: no copy): append the other tensors and put the header in the room before, padded
    with spaces as the format allows. False, and the file left as it was, when the header needs more room."""
    blob = _header(tensors, metadata)
    if 8 + len(blob) > room or room % 8:
        return False
    first, *rest = tensors.values()
    if Path(path).stat().st_size != room + _nbytes(first[1], np.dtype(first[0])):
        raise ValueError(f"{path}: holds more or less than its first tensor after byte {room}")
    with WriteOnce(path, append=True, keep=True) as out:
        for dtype, data in rest:
            _put(out, dtype, data)
    with open(path, "r+b") as out:  # not through the append fd: Linux appends a pwrite there
        out.write(struct.pack("<Q", room - 8) + blob.ljust(room - 8))
    return True


def header(path: str | Path) -> tuple[dict, int]:
    """(a safetensors file's JSON header, the byte where its tensor data starts); ValueError if it has none."""
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: not a safetensors file")
        (n,) = struct.unpack("<Q", head)
        try:
            return json.loads(fh.read(n)), 8 + n
        except ValueError:  # bytes that are not a JSON header
            raise ValueError(f"{path}: not a safetensors file (unreadable header)") from None


def located_in(path: str | Path, name: str) -> tuple[dict, int]:
    """(tensor `name`'s header entry, the byte where the file's tensor data starts)."""
    tensors, base = header(path)
    return tensors[name], base


def memmap(path: str | Path, name: str, located: tuple[dict, int] | None = None) -> np.ndarray:
    """Tensor `name` of a safetensors file as a read-only memory map (1-D tensors only); `located`: its header
    entry and the file's data start, when already read (located_in())."""
    info, base = located or located_in(path, name)
    dtype = {v: k for k, v in DTYPES.items()}[info["dtype"]].newbyteorder("<")
    a, b = info["data_offsets"]
    if a == b:  # mmap cannot map 0 bytes
        return np.zeros(0, dtype)
    return np.memmap(path, dtype, "r", offset=base + a, shape=((b - a) // dtype.itemsize,))
