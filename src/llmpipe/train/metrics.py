"""metrics.jsonl, one strict-JSON record a line (llmpipe.io.dumps), for every trainer we own.

A run killed mid-write can leave its last line cut short: reading skips such a line (and blank ones)
instead of failing, and a resumed run first drops what the killed run logged after the step it resumes
from (`MetricsWriter`). No torch at import: the Levanter environment reads and writes through here too.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from llmpipe.io import atomic_path, dumps

log = logging.getLogger(__name__)


def _parse(line: str) -> dict | None:
    """A metrics line's record; None for a line cut short by a kill, a blank one, or one without a step."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("step"), (int, float)) else None


def _lines(path: Path) -> list[tuple[str, dict]]:
    """(line, record) for every whole record line of `path` (none if it does not exist)."""
    if not path.exists():
        return []
    return [(line, rec) for line in path.read_text().splitlines() if (rec := _parse(line)) is not None]


def read_records(path: Path) -> list[dict]:
    """The whole records of a metrics.jsonl, in file order."""
    return [rec for _, rec in _lines(path)]


def write_records(path: Path, records: list[dict], sort_keys: bool = False) -> None:
    """Replace `path` atomically with `records`, one strict-JSON line each."""
    with atomic_path(path) as tmp:
        tmp.write_text("".join(dumps(r, sort_keys=sort_keys) + "\n" for r in records))


class MetricsWriter:
    """Appends one record a step (rank 0 only: `enabled`); on start keeps the existing lines up to
    `resume_step` and drops the rest. tensorboard=True also mirrors numbers to <dir>/tensorboard when
    TensorBoard is installed, hiding an earlier run's events after `resume_step` (its purge_step)."""

    def __init__(self, path: Path, resume_step: int = 0, enabled: bool = True, tensorboard: bool = False):
        self.path, self.enabled, self.tb = Path(path), enabled, None
        if not enabled:
            return
        kept = [line for line, rec in _lines(self.path) if rec["step"] <= resume_step]
        with atomic_path(self.path) as tmp:
            tmp.write_text("".join(line + "\n" for line in kept))
        if tensorboard:
            self.tb = _summary_writer(self.path, resume_step)

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as fh:
            fh.write(dumps(record) + "\n")
        if self.tb:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.tb.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self.tb:
            self.tb.close()


def _summary_writer(metrics: Path, resume_step: int):
    """A TensorBoard writer into <metrics dir>/tensorboard, or None when TensorBoard is not installed.
    TensorBoard drops the events of steps after `resume_step` that earlier writers left there."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        log.info("tensorboard not installed: metrics go to %s only", metrics)
        return None
    return SummaryWriter(str(metrics.parent / "tensorboard"), purge_step=resume_step + 1)
