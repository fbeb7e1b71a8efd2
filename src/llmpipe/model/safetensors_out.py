"""Writing HF safetensors weight files with one tensor in memory at a time (neuron-merge, export): files
planned from the tensors' shapes, each written header first, then tensor by tensor; glibc told to map and
return large allocations (freed tensors leave RSS)."""

from __future__ import annotations

import ctypes
import json
import math
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
Entry = tuple[str, Callable[[torch.Tensor], None]]  # a tensor's name, and what fills it (given its buffer)
MAX_FILE_BYTES = 5 << 30  # transformers 4.x save_pretrained's default shard size (5.x: 50 GB, init-model's SAVE_FILE_BYTES)
IGNORED = ("rotary_emb.",)  # buffers a trainer may save; not weights of the HF model
READ_DTYPES = {v: k for k, v in ST_DTYPES.items()}  # safetensors' dtype names -> torch


def not_weight(name: str) -> bool:
    """A buffer a trainer may have saved (IGNORED), not a weight of the HF model."""
    return any(s in name for s in IGNORED)


def plan_files(shapes: list[tuple[str, tuple]], dtype: torch.dtype, max_bytes: int) -> dict[str, list]:
    """Tensors per output file, in order, each file at most max_bytes (HF names: model.safetensors, or
    model-0000i-of-0000n.safetensors)."""
    size = torch.empty((), dtype=dtype).element_size()
    groups, current, used = [], [], 0
    for name, shape in shapes:
        nbytes = math.prod(shape) * size
        if current and used + nbytes > max_bytes:
            groups.append(current)
            current, used = [], 0
        current.append((name, shape))
        used += nbytes
    groups.append(current)
    if len(groups) == 1:
        return {"model.safetensors": groups[0]}
    return {f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors": g for i, g in enumerate(groups)}


ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def write_safetensors(path: Path, entries: list[tuple[str, tuple]], tensors: Iterator[Entry], dtype: torch.dtype) -> None:
    """Stream tensors into one safetensors file: the header (known from the shapes) first, then each
    tensor, assembled in a buffer of its own that is freed once written, so only one tensor is in
    memory (safetensors' save_file needs them all). The format: 8-byte little-endian header size,
    JSON header (padded to 8 bytes), data."""
    size = torch.empty((), dtype=dtype).element_size()
    header, at = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in entries:
        n = math.prod(shape) * size
        header[name] = {"dtype": ST_DTYPES[dtype], "shape": list(shape), "data_offsets": [at, at + n]}
        at += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for name, shape in entries:
            got, fill = next(tensors)
            if got != name:
                raise ValueError(f"merge: expected {name}, got {got}")
            t = torch.empty(shape, dtype=dtype)
            fill(t)
            fh.write(memoryview(t.view(-1).view(torch.uint8).numpy()))
            del t


def write_index(folder: Path, plan: dict[str, list], dtype: torch.dtype) -> dict[str, str]:
    """model.safetensors.index.json for a plan of more than one file; the weight map (name -> file)."""
    weight_map = {name: fname for fname, entries in plan.items() for name, _ in entries}
    if len(plan) > 1:
        size = torch.empty((), dtype=dtype).element_size()
        total = sum(math.prod(shape) * size for entries in plan.values() for _, shape in entries)  # tensor bytes, as HF
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return weight_map


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to tune
        return None


def map_large_allocations() -> None:
    """glibc raises its mmap threshold after big frees, then serves later tensors from the heap, where
    freed read buffers stay in RSS between live tensors; a fixed 1 MiB threshold maps every tensor
    and returns it to the OS when freed."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD


def release_freed_memory() -> None:
    """Return freed heap memory to the OS between rank files."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
