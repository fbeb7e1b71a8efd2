"""Training backends. A backend is a module llmpipe.backends.<name> plus rules/train_<name>.smk;
its rules must produce the HF-format folder <run>/checkpoints/<name>/final/ that export reads."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg)


def get(name: str):
    if name not in available():
        raise ValueError(f"unknown train.backend {name!r}; available: {', '.join(available())}")
    return importlib.import_module(f"{__name__}.{name}")


def rules_by_backend(rules_dir: str | Path) -> dict[str, list[str]]:
    """The rules each backend's rules/train_<name>.smk defines."""
    return {f.stem.removeprefix("train_"): re.findall(r"^rule (\w+):", f.read_text(), re.M)
            for f in sorted(Path(rules_dir).glob("train_*.smk"))}
