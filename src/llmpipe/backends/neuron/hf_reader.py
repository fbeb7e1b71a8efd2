"""Read slices of an HF checkpoint's tensors without loading the model.

safetensors (single file or sharded with model.safetensors.index.json): the header gives each
tensor's dtype, shape and byte range; a row range is one `os.pread`, a column range is read in blocks
of rows. `.bin` checkpoints (torch.save) the same way, at the offsets torchfile finds. Nothing is
memory-mapped: pages of a mapping count in the process's RSS once touched, so a mapped 1B model would
show ~1x its size in RSS after one pass, while pread leaves only the slices we keep (the kernel's
page cache is not the process's memory).
"""

from __future__ import annotations

from pathlib import Path

import torch

from llmpipe.backends.neuron import torchfile
from llmpipe.data import stfile
from llmpipe.model.folder import FolderError
from llmpipe.model.weights import indexed

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
BLOCK = 16 << 20  # bytes per read for column slices


class _SafetensorsFile:
    def __init__(self, path: Path):
        self.path = path
        header, self.base = stfile.header(path)
        header.pop("__metadata__", None)
        self.entries = header

    def shape(self, name: str) -> tuple:
        return tuple(self.entries[name]["shape"])

    def dtype(self, name: str) -> torch.dtype:
        return DTYPES[self.entries[name]["dtype"]]

    def read(self, name: str, start: int, stop: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows [start, stop) of tensor `name` (dim 0), into `out` (contiguous, right shape) or a new tensor."""
        e = self.entries[name]
        dtype, shape = DTYPES[e["dtype"]], e["shape"]
        if out is None:
            out = torch.empty((stop - start, *shape[1:]), dtype=dtype)
        if out.dtype != dtype or tuple(out.shape) != (stop - start, *shape[1:]) or not out.is_contiguous():
            raise ValueError(f"{self.path}: {name} rows {start}:{stop} do not fit the buffer {tuple(out.shape)} {out.dtype}")
        size = out.numel() * out.element_size()
        offset = self.base + e["data_offsets"][0] + start * (size // max(1, stop - start))
        torchfile.pread_into(self.path, torchfile.tensor_bytes(out), offset)
        return out


class _TorchFile:
    """A `.bin` checkpoint (torch.save of a state dict), read at its tensors' offsets."""

    def __init__(self, path: Path):
        self.path = path
        self.entries = torchfile.load(path)

    def shape(self, name: str) -> tuple:
        return tuple(self.entries[name].shape)

    def dtype(self, name: str) -> torch.dtype:
        return self.entries[name].dtype

    def read(self, name: str, start: int, stop: int, out: torch.Tensor | None = None) -> torch.Tensor:
        return torchfile.read(self.path, self.entries[name], start, stop, out)


class HFCheckpoint:
    """Tensors of an HF model folder by name: shape, rows (dim-0 slice), cols (dim-1 slice)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self._where: dict[str, _SafetensorsFile | _TorchFile] = {}
        self._shapes: dict[str, tuple] = {}
        files = indexed(self.folder)  # FolderError for a listed file that is missing
        if files is None:
            files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            bins = sorted(self.folder.glob("pytorch_model*.bin")) or sorted(self.folder.glob("*.bin"))
            if not bins:
                raise FolderError(f"{self.folder}: no *.safetensors or *.bin weights")
        for f in files or bins:
            src = _SafetensorsFile(f) if files else _TorchFile(f)
            for name in src.entries:
                self._where[name], self._shapes[name] = src, src.shape(name)

    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def shape(self, name: str) -> tuple:
        return self._shapes[name]

    def dtype(self, name: str) -> torch.dtype:
        return self._where[name].dtype(name)

    def rows(self, name: str, start: int = 0, stop: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows [start, stop) (dim 0), into `out` (contiguous, that shape and the tensor's dtype) or a new tensor."""
        stop = self._shapes[name][0] if stop is None else stop
        return self._where[name].read(name, start, stop, out)

    def full(self, name: str) -> torch.Tensor:
        if not self._shapes[name]:
            src = self._where[name]
            return src.read(name, 0, 1).reshape(()) if isinstance(src, _SafetensorsFile) else src.read(name, 0, None)  # 0-d
        return self.rows(name)

    def cols(self, name: str, start: int, stop: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Columns [start, stop) of a 2-D tensor, read in blocks of rows, into `out` or a new tensor."""
        rows, width = self._shapes[name]
        dtype = self.dtype(name)
        out = torch.empty((rows, stop - start), dtype=dtype) if out is None else out
        if tuple(out.shape) != (rows, stop - start) or out.dtype != dtype:
            raise ValueError(f"{name} columns {start}:{stop} do not fit the buffer {tuple(out.shape)} {out.dtype}")
        step = max(1, BLOCK // max(1, width * out.element_size()))
        block = torch.empty((min(step, rows), width), dtype=dtype)
        for r in range(0, rows, step):
            n = min(rows, r + step) - r
            out[r : r + n] = self.rows(name, r, r + n, block[:n])[:, start:stop]
        return out
