"""Read NxD rank files without torch_xla: plain torch.save dicts, or xser checkpoints.

xser (`--save_load_xser 1`, NxD's default): `<rank>.pt` is a reference file, a torch.save of the state
dict whose tensors are `torch_xla.utils.serialization.TensorReference(tid)` objects; tensor `tid`
lives in `<rank>.pt.tensors/tensor_<tid>.pt` (a torch.save of one CPU tensor); `<rank>.pt.info.pt`
holds {tid: {dtype, shape}}. Everything is read with torch.load(weights_only=True): the reference
class is allow-listed under its torch_xla name and mapped to a local stand-in, so no torch_xla and
no arbitrary unpickling. Tensors are memory-mapped and loaded only when asked for.
"""

from __future__ import annotations

from pathlib import Path

import torch

XSER_CLASS = "torch_xla.utils.serialization.TensorReference"


class TensorReference:
    """Stand-in for torch_xla's TensorReference (a tensor id; older versions also shape and dtype)."""

    def __init__(self, tid: int = -1):
        self.tid = tid

    def __setstate__(self, state):
        if isinstance(state, tuple):  # (dict or None, slots dict) from a __slots__ class
            state = {**(state[0] or {}), **(state[1] or {})}
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"TensorReference({self.tid})"


def _load(path: Path, mmap: bool = False):
    with torch.serialization.safe_globals([(TensorReference, XSER_CLASS)]):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


class RankFile:
    """One rank's model state: names and lazily loaded tensors (a nested {"model": {...}} is unwrapped)."""

    def __init__(self, path: str | Path, model_key: str = "model"):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"NxD rank file missing: {self.path}")
        self.tensors_dir = Path(f"{self.path}.tensors")
        self.xser = self.tensors_dir.is_dir()
        state = _load(self.path, mmap=not self.xser)
        if isinstance(state, dict) and model_key in state and isinstance(state[model_key], dict):
            state = state[model_key]
        if not isinstance(state, dict):
            raise ValueError(f"{self.path}: expected a state dict, found {type(state).__name__}")
        self.state = state

    def keys(self) -> list[str]:
        return list(self.state)

    def __contains__(self, name: str) -> bool:
        return name in self.state

    def get(self, name: str) -> torch.Tensor:
        value = self.state[name]
        if isinstance(value, TensorReference):
            f = self.tensors_dir / f"tensor_{value.tid}.pt"
            if not f.is_file():
                raise FileNotFoundError(f"{self.path}: {name} refers to missing {f}")
            value = _load(f, mmap=True)
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{self.path}: {name} is {type(value).__name__}, not a tensor")
        return value
