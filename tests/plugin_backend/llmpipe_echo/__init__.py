"""A test backend that plugs in from outside the package (entry point group `llmpipe.backends`).

TEST DOUBLE, not a trainer: `echo-train` copies the initial model to checkpoints/echo/final unchanged,
so the test can prove that a backend declared in four places (this folder: declaration, section schema,
rules file, CLI) is planned, checked and run by the real workflow, export included.
"""

from pathlib import Path

from llmpipe.backends import Backend


def _checks(cfg: dict) -> list[str]:
    e = cfg["echo"]
    if e["copies"] > 1 and cfg["parallel"]["nnodes"] > 1:
        return [f"'echo.copies' {e['copies']} needs 'parallel.nnodes' 1 (got {cfg['parallel']['nnodes']})"]
    return []


BACKEND = Backend(
    name="echo",
    doc="TEST DOUBLE: copies the initial model (tests/plugin_backend)",
    commands={"echo-train": "llmpipe_echo.train"},
    rules=Path(__file__).with_name("train_echo.smk"),
    section_schema=Path(__file__).with_name("schema.yaml"),
    checks=_checks,
)
