"""Write a safetensors file whose tensors come from files on disk, streaming (constant memory).

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


def write(path: str | Path, tensors: dict[str, tuple[np.dtype, Path | np.ndarray]], metadata: dict[str, str]) -> None:
    """tensors: name -> (dtype, a raw little-endian file or an array); 1-D tensors only."""
    header, parts, offset = {}, [], 0
    for name, (dtype, data) in tensors.items():
        dtype = np.dtype(dtype)
        nbytes = Path(data).stat().st_size if isinstance(data, Path) else np.asarray(data, dtype).nbytes
        if nbytes % dtype.itemsize:
            raise ValueError(f"{name}: {nbytes} bytes is not a whole number of {dtype}")
        header[name] = {"dtype": DTYPES[dtype], "shape": [nbytes // dtype.itemsize], "data_offsets": [offset, offset + nbytes]}
        parts.append((dtype, data))
        offset += nbytes
    header["__metadata__"] = metadata
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with WriteOnce(path) as out:
        out.write(struct.pack("<Q", len(blob)))
        out.write(blob)
        for dtype, data in parts:
            if isinstance(data, Path):
                with open(data, "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 22)
            else:
                out.write(np.ascontiguousarray(data, dtype=dtype.newbyteorder("<")).tobytes())


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


def memmap(path: str | Path, name: str) -> np.ndarray:
    """Tensor `name` of a safetensors file as a read-only memory map (1-D tensors only)."""
    tensors, base = header(path)
    info = tensors[name]
    dtype = {v: k for k, v in DTYPES.items()}[info["dtype"]].newbyteorder("<")
    a, b = info["data_offsets"]
    if a == b:  # mmap cannot map 0 bytes
        return np.zeros(0, dtype)
    return np.memmap(path, dtype, "r", offset=base + a, shape=((b - a) // dtype.itemsize,))
