"""Training backends. A backend is a module llmpipe.backends.<name> plus rules/train_<name>.smk;
its rules must produce the HF-format folder <run>/checkpoints/<name>/final/ that export reads."""

from __future__ import annotations

import importlib
import pkgutil


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg)


def get(name: str):
    if name not in available():
        raise ValueError(f"unknown train.backend {name!r}; available: {', '.join(available())}")
    return importlib.import_module(f"{__name__}.{name}")
