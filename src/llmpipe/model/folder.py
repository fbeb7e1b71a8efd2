"""Local folders a step reads, checked before transformers or datasets does: from_pretrained takes a path
that does not exist for a Hugging Face Hub repo id (`runs/final` is one), so a typo would download, or
offline retry for ~26 s and end in a traceback; every local model load passes local_files_only too."""

from __future__ import annotations

from pathlib import Path


class FolderError(ValueError):
    """A local input folder that is missing or lacks what the step reads: one line naming the flag."""


# What from_pretrained loads weights from (a sharded checkpoint has its index).
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def model_folder(path: str | Path, flag: str) -> str:
    """`path` as from_pretrained's argument, once it is a folder with config.json and weights; else FolderError."""
    _folder(path, flag, "config.json", "a Hugging Face model folder")
    if not any((Path(path) / name).is_file() for name in WEIGHTS):
        raise FolderError(f"{flag} {path}: no model weights (none of {', '.join(WEIGHTS)})")
    return str(path)


def tokenizer_folder(path: str | Path, flag: str) -> Path:
    """`path` once it holds tokenizer.json; else FolderError."""
    _folder(path, flag, "tokenizer.json", "a tokenizer folder")
    return Path(path)


def view_folder(path: str | Path, flag: str, splits: tuple[str, ...] = ("train", "val")) -> Path:
    """`path` once it holds view.json and these splits of an hf view (llmpipe pack); else FolderError."""
    _folder(path, flag, "view.json", "an hf data view (llmpipe pack)")
    for split in splits:
        _folder(path, flag, f"{split}/dataset_info.json", "an hf data view (llmpipe pack)")
    return Path(path)


def _folder(path: str | Path, flag: str, needed: str, what: str) -> None:
    if not Path(path).is_dir():
        raise FolderError(f"{flag} {path}: no such folder")
    if not (Path(path) / needed).is_file():
        raise FolderError(f"{flag} {path}: no {needed} (not {what})")
