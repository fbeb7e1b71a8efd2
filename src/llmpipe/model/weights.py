"""An HF model folder's safetensors weights read and copied tensor by tensor (export, init-model): headers
only to plan, each tensor read with pread and cast as it is copied into its output file, so a 70B moves
in about 2-3x its largest tensor (export 1.8x, init-model 2.7x: tests)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from llmpipe.data import stfile
from llmpipe.model.folder import FolderError
from llmpipe.model.safetensors_out import (
    MAX_FILE_BYTES,
    READ_DTYPES,
    map_large_allocations,
    plan_files,
    write_index,
    write_safetensors,
)

Found = dict[str, tuple[Path, int, str, tuple]]  # name -> (file, data offset, safetensors dtype, shape)


def weight_files(folder: Path) -> list[Path] | None:
    """The safetensors files of an HF model folder (its index's, or model.safetensors); None: .bin weights."""
    listed = indexed(folder)
    if listed is not None:
        return listed
    return [folder / "model.safetensors"] if (folder / "model.safetensors").is_file() else None


def indexed(folder: Path) -> list[Path] | None:
    """The files model.safetensors.index.json lists (None: no index); FolderError naming those missing (a
    download or copy cut short) before any is read."""
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return None
    try:
        files = sorted({folder / f for f in json.loads(index.read_text())["weight_map"].values()})
    except (ValueError, KeyError, TypeError, AttributeError):
        raise FolderError(f"{index}: not a safetensors index (no weight_map of tensor names to files)") from None
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise FolderError(
            f"{folder}: {len(missing)} of the {len(files)} weight files its model.safetensors.index.json lists are "
            f"missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): a download or copy cut short?"
        )
    return files


def why_not_by_name(model) -> str | None:
    """Why `model`'s tensors cannot be read one by one as its weight files name them (so it must load whole
    through from_pretrained), or None: transformers converts its weights as it loads them (renames, fused
    experts), or it has persistent buffers (values the files hold that no parameter does). `model` may be on the
    meta device."""
    from transformers.conversion_mapping import get_model_conversion_mapping

    if get_model_conversion_mapping(model, add_legacy=False) or getattr(model, "_keys_to_ignore_on_save", None):
        return f"transformers converts {type(model).__name__}'s weights as it loads and saves them"
    if set(model.state_dict()) & {name for name, _ in model.named_buffers()}:
        return "its model has persistent buffers"
    return None


def tensors_of(files: list[Path], skip) -> Found:
    """name -> (file, data offset, safetensors dtype, shape) of each tensor, from the files' headers only. A name
    the file's metadata maps to a tensor it holds (safetensors' save_model keeps one name of tied weights, the
    first in sorted order: a tied Llama's lm_head.weight, its embedding's name left in the metadata) reads
    that tensor."""
    out = {}
    for path in files:
        try:
            header, base = stfile.header(path)
        except ValueError as exc:  # not a safetensors file, named
            raise FolderError(str(exc)) from None
        meta = header.get("__metadata__") or {}
        aliases = {name: kept for name, kept in meta.items() if name not in header and kept in header and kept != "__metadata__"}
        for name, info in [*header.items(), *((a, header[kept]) for a, kept in aliases.items())]:
            if name != "__metadata__" and not skip(name) and name not in out:
                if info["dtype"] not in READ_DTYPES:
                    raise ValueError(f"{path}: tensor {name} is {info['dtype']}, not a float weight")
                out[name] = (path, base + info["data_offsets"][0], info["dtype"], tuple(info["shape"]))
    return out


def read_tensor(path: Path, at: int, st_dtype: str, shape: tuple) -> torch.Tensor:
    """One tensor, read with pread (no memory map: mapped pages would stay in RSS)."""
    dtype = READ_DTYPES[st_dtype]
    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    buf = bytearray(n)
    with open(path, "rb") as fh:
        fh.seek(at)
        if fh.readinto(buf) != n:
            raise ValueError(f"{path}: cut short (tensor at byte {at})")
    return torch.frombuffer(buf, dtype=dtype).reshape(shape) if n else torch.empty(shape, dtype=dtype)


def copy_weights(found: Found, folder: Path, dtype: torch.dtype, max_bytes: int | None = None) -> tuple[int, list[str]]:
    """Write the `found` tensors, cast to `dtype`, into HF weight files in `folder` of at most `max_bytes` each
    (default MAX_FILE_BYTES) and their index if several, one tensor in memory at a time. Returns (files written,
    names of tensors holding a non-finite value once cast: the caller refuses the folder). Writing stops at the first
    such tensor (a 70B would otherwise write hundreds of GB to refuse them); the rest are only read, to name
    them all."""
    checked = set()

    def fill(name):
        def put(t: torch.Tensor) -> None:
            t.copy_(read_tensor(*found[name]))  # cast as copied: no third copy
            checked.add(name)
            if not torch.isfinite(t).all():
                raise _NonFinite(name)

        return put

    map_large_allocations()
    plan = plan_files([(name, info[3]) for name, info in found.items()], dtype, max_bytes or MAX_FILE_BYTES)
    entries = ((name, fill(name)) for name in found)
    try:
        for fname, planned in plan.items():
            write_safetensors(folder / fname, planned, entries, dtype)
    except _NonFinite as first:
        rest = [n for n in found if n not in checked and not torch.isfinite(read_tensor(*found[n]).to(dtype)).all()]
        return len(plan), [first.name, *rest]
    write_index(folder, plan, dtype)
    return len(plan), []


class _NonFinite(Exception):
    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def generation_config(folder: str | Path):
    """The folder's generation_config.json, else the one from_pretrained gives a model without it: read from
    its config.json (generation settings such as max_length or temperature kept there)."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(str(folder), local_files_only=True)
    except OSError:
        return GenerationConfig.from_pretrained(
            str(folder), config_file_name="config.json", _from_model_config=True, local_files_only=True
        )
