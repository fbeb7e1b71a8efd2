"""Training backends: each is a small declared thing (`Backend`), found by name.

A backend is a package that defines `BACKEND = Backend(...)` in its `__init__.py`: its config section
(schema.yaml beside it), its checks, its CLI commands, its rules file and the environment it runs in.
Built-in ones live here (llmpipe.backends.<name>); others plug in through the Python entry-point group
`llmpipe.backends` (name = module). Its rules must produce the HF folder <run>/checkpoints/<name>/final/.
Checklist for a new backend: docs/backends.md ("Adding a backend").
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]  # the checkout: rules/, envs/, scripts/
ENTRY_POINTS = "llmpipe.backends"


@dataclass(frozen=True)
class Backend:
    name: str
    doc: str  # one line for `llmpipe backends` and error messages
    commands: dict[str, str] = field(default_factory=dict)  # CLI name "<name>-<step>" -> module with main(argv)
    rules: str | Path | None = None  # rules file; None = rules/train_<name>.smk of this checkout
    env: str | None = None  # conda env file the rules use (envs/<name>.yaml)
    setup: str | None = None  # script that builds its side environment (.venvs/<name>)
    env_requires: tuple[str, ...] = ()  # what its interpreter (config <name>.python) must have (llmpipe doctor)
    env_tools: tuple[str, ...] = ()  # commands beside that interpreter or on PATH (llmpipe doctor)
    section_schema: str | Path | None = None  # JSON schema (YAML) of config section <name>; None = no section
    checks: Callable[[dict], list[str]] | None = None  # config -> problems, each naming its keys
    parallel_defaults: Callable[[dict], dict] | None = None  # config -> its values for parallel.* left null
    document_masking: bool = False  # its trainer honours train.document_masking (evaluate then scores the same way)
    process_per_gpu: bool = False  # on GPUs its trainer runs one process a GPU (nproc_per_node <= gres GPUs)
    # config -> its fingerprint sections beside train.* (the layout its checkpoints hold): its trainer
    # records them and the workflow refuses, before any job, a change that would not resume
    resume_sections: Callable[[dict], dict] | None = None
    # <run>/checkpoints/<name> -> (its newest complete checkpoint, {"fingerprint": ...} recorded for it) or
    # None; None = llmpipe.train's checkpoints (step_<N>/trainer_state.json)
    newest_state: Callable[[Path], tuple[Path, dict] | None] | None = None
    # (config, <run>/checkpoints/<name>) -> why its newest checkpoint cannot resume under this config though
    # the fingerprint agrees (NxD's ZeRO-1 optimizer state is cut by DP), or None; checked when the workflow is
    # parsed (train.resume true), and again by the backend's own command before it launches
    resume_refusal: Callable[[dict, Path], str | None] | None = None

    def rules_file(self) -> Path:
        return Path(self.rules) if self.rules else REPO / "rules" / f"train_{self.name}.smk"

    def rule_names(self) -> list[str]:
        return re.findall(r"^rule (\w+):", self.rules_file().read_text(), re.M)


def _builtin() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg)


def _plugins() -> dict[str, str]:
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINTS)}


def available() -> list[str]:
    return sorted({*_builtin(), *_plugins()})


@functools.cache
def get(name: str) -> Backend:
    if name in _builtin():
        module = importlib.import_module(f"{__name__}.{name}")
    elif name in _plugins():
        module = importlib.import_module(_plugins()[name])
    else:
        raise ValueError(f"unknown train.backend {name!r}; available: {', '.join(available())}")
    backend = getattr(module, "BACKEND", None)
    if not isinstance(backend, Backend) or backend.name != name:
        raise ValueError(f"backend module {module.__name__} defines no BACKEND = Backend(name={name!r}, ...)")
    return backend


def all_backends() -> list[Backend]:
    return [get(name) for name in available()]


def commands() -> dict[str, str]:
    """Every backend's CLI commands (llmpipe <name>-<step>)."""
    return {cmd: module for b in all_backends() for cmd, module in b.commands.items()}


def workflow_rules() -> set[str]:
    """Every rule name of the workflow: the Snakefile, rules/*.smk and each backend's rules file."""
    files = [REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk")), *(b.rules_file() for b in all_backends())]
    return {
        name for f in dict.fromkeys(files) if f.is_file() for name in re.findall(r"^(?:local)?rule (\w+):", f.read_text(), re.M)
    }


def rules_by_backend() -> dict[str, list[str]]:
    """The rules each backend's rules file defines."""
    return {b.name: b.rule_names() for b in all_backends()}
