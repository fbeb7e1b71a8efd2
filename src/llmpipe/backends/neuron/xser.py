"""Read NxD rank files without torch_xla: plain torch.save dicts, or xser checkpoints.

xser (`--save_load_xser 1`, NxD's default): `<rank>.pt` is a reference file, a torch.save of the state
dict whose tensors are `torch_xla.utils.serialization.TensorReference(tid)` objects; tensor `tid`
lives in `<rank>.pt.tensors/tensor_<tid>.pt` (a torch.save of one CPU tensor); `<rank>.pt.info.pt`
holds {tid: {dtype, shape}}. Everything is read with torch.load(weights_only=True): the reference
class is allow-listed under its torch_xla name and mapped to a local stand-in, so no torch_xla and
no arbitrary unpickling. Only the pickles are loaded up front (tensors on the meta device); a
tensor, or a row range of it, is read from its file when asked for (torchfile: one os.pread, no
memory map), so the caller holds only what it asked for.
"""

from __future__ import annotations

from pathlib import Path

import torch

from llmpipe.backends.neuron import torchfile

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


def _load(path: Path):
    return torchfile.load(path, [(TensorReference, XSER_CLASS)])


class RankFile:
    """One rank's model state: names, shapes, and tensors read when asked for (a nested {"model": {...}} is unwrapped)."""

    def __init__(self, path: str | Path, model_key: str = "model"):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"NxD rank file missing: {self.path}")
        self.tensors_dir = Path(f"{self.path}.tensors")
        self.xser = self.tensors_dir.is_dir()
        try:
            state = _load(self.path)
        except Exception as exc:  # a truncated or foreign file: torch's message does not name it
            raise ValueError(f"NxD rank file {self.path} cannot be read ({type(exc).__name__}: {exc})") from exc
        if isinstance(state, dict) and model_key in state and isinstance(state[model_key], dict):
            state = state[model_key]
        if not isinstance(state, dict):
            raise ValueError(f"{self.path}: expected a state dict, found {type(state).__name__}")
        self.state = state

    def keys(self) -> list[str]:
        return list(self.state)

    def __contains__(self, name: str) -> bool:
        return name in self.state

    def _locate(self, name: str) -> tuple[Path, torch.Tensor]:
        """(the file holding tensor `name`, the tensor as loaded: on the meta device)."""
        value, path = self.state[name], self.path
        if isinstance(value, TensorReference):
            path = self.tensors_dir / f"tensor_{value.tid}.pt"
            if not path.is_file():
                raise FileNotFoundError(f"{self.path}: {name} refers to missing {path}")
            value = _load(path)
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{path}: {name} is {type(value).__name__}, not a tensor")
        return path, value

    def shape(self, name: str) -> tuple:
        return tuple(self._locate(name)[1].shape)

    def get(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Tensor `name`, or its rows [start, stop), read from disk into a new tensor."""
        return torchfile.read(*self._locate(name), start, stop)
