"""torch.save files read and written one tensor at a time, so memory stays about one tensor.

Reading: torch.load(map_location="meta") gives the tensors' shapes and dtypes and, on each storage,
`_checkpoint_offset`, where its bytes start in the file; a tensor or a row range of it is then read
with os.pread into memory we own and free. (A memory map would also read lazily, but every page it
touches counts in the process's RSS until the whole map goes.) A torch without those offsets gets
memory-mapped tensors instead.

Writing: torch.save's own writer (torch.serialization._save and _open_zipfile_writer, private: the
test compares the bytes with torch.save's) is given placeholder tensors from torch.empty, whose large
allocations are address space with no resident pages until written to; each is filled just before
its record is written and freed right after, so the file is byte for byte what torch.save writes
while one tensor at a time is resident (a rank file's size is reserved as address space).
"""

from __future__ import annotations

import ctypes
import os
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

# (name, shape, dtype, fill): fill(out) writes the tensor into `out` (a new tensor of that shape and dtype)
Entry = tuple[str, tuple, torch.dtype, Callable[[torch.Tensor], object]]


def pread_into(path: str | Path, view: memoryview, offset: int) -> None:
    """Fill `view` with the bytes of `path` from `offset` on."""
    fd = os.open(path, os.O_RDONLY)
    try:
        done = 0
        while done < len(view):
            got = os.preadv(fd, [view[done:]], offset + done)
            if got <= 0:
                raise OSError(f"{path}: short read at byte {offset + done}")
            done += got
    finally:
        os.close(fd)


def _tensors(obj) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def _offset(t: torch.Tensor) -> int | None:
    base = getattr(t.untyped_storage(), "_checkpoint_offset", None)
    return None if base is None else base + t.storage_offset() * t.element_size()


def load(path: str | Path, safe_globals: list | None = None):
    """A torch.save file's object with its tensors on the meta device (nothing read but the pickle)."""
    with torch.serialization.safe_globals(safe_globals or []):
        obj = torch.load(path, map_location="meta", weights_only=True)
        if all(_offset(t) is not None for t in _tensors(obj)):
            return obj
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def read(path: str | Path, t: torch.Tensor, start: int = 0, stop: int | None = None, out: torch.Tensor | None = None):
    """Rows [start, stop) (dim 0) of tensor `t` of `load(path)`, into `out` (same shape and dtype) or a new tensor."""
    part = t[start:stop] if t.dim() else t
    if out is None:
        out = torch.empty(part.shape, dtype=t.dtype)
    if out.shape != part.shape or out.dtype != t.dtype or not out.is_contiguous():
        raise ValueError(
            f"{path}: rows {start}:{stop} of a {tuple(t.shape)} {t.dtype} tensor do not fit {tuple(out.shape)} {out.dtype}"
        )
    if t.device.type != "meta":  # memory-mapped (torch without checkpoint offsets)
        return out.copy_(part)
    if not part.is_contiguous():  # a strided view: read its whole storage extent, then take the view
        extent = part.storage_offset() + sum((n - 1) * s for n, s in zip(part.shape, part.stride())) + 1
        whole = torch.empty(extent if part.numel() else 0, dtype=t.dtype)
        pread_into(path, tensor_bytes(whole), _offset(t) - t.storage_offset() * t.element_size())
        return out.copy_(whole.as_strided(part.shape, part.stride(), part.storage_offset()))
    pread_into(path, tensor_bytes(out), _offset(t) + (part.storage_offset() - t.storage_offset()) * t.element_size())
    return out


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """A contiguous tensor's bytes, writable. Not through .numpy(): that makes the storage
    non-resizable for good, and `save` frees its placeholders by resizing them to 0."""
    n = t.numel() * t.element_size()
    return memoryview((ctypes.c_ubyte * n).from_address(t.data_ptr())).cast("B") if n else memoryview(b"")


class _Filling:
    """torch's zip writer, filling each placeholder's storage just before its record and freeing it after."""

    def __init__(self, writer, jobs: dict[int, tuple[torch.Tensor, Callable]]):
        self.writer, self.jobs = writer, jobs

    def write_record(self, name, data, nbytes):
        job = self.jobs.pop(data.data_ptr(), None) if isinstance(data, torch.UntypedStorage) and nbytes else None
        if job:
            job[1](job[0])
        self.writer.write_record(name, data, nbytes)
        if job and data.resizable():  # (.numpy() on it would have made it fixed: then it stays till the end)
            data.resize_(0)  # the placeholder's memory goes back now

    def __getattr__(self, name):
        return getattr(self.writer, name)


def save(path: str | Path, entries: list[Entry]) -> None:
    """torch.save({name: tensor}, path) where each tensor exists only while its bytes are written."""
    state = {name: torch.empty(shape, dtype=dtype) for name, shape, dtype, _ in entries}
    jobs = {state[n].untyped_storage().data_ptr(): (state[n], fill) for n, _, _, fill in entries if state[n].numel()}
    if len(jobs) != sum(1 for t in state.values() if t.numel()):
        raise ValueError(f"{path}: placeholders share memory")
    ser = torch.serialization
    with ser._open_zipfile_writer(os.fspath(path)) as writer:
        ser._save(state, _Filling(writer, jobs), pickle, ser.DEFAULT_PROTOCOL, False)
    if jobs:
        raise RuntimeError(f"{path}: torch.save wrote {len(jobs)} tensor(s) without their data")
