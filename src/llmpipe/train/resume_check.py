"""resume-check: before training, refuse checkpoints trained on another data view or initial model.

A job of its own (rule resume_check), so Snakemake does not delete the old trained model first, as it
would the training job's output. Passes when train.resume is false or there is nothing to resume.

  llmpipe resume-check --checkpoints DIR --init DIR --data VIEW --run NAME [--no-resume] --out FILE
"""

from __future__ import annotations

import argparse
from pathlib import Path

from llmpipe.io import write_json
from llmpipe.train.resume import changed_inputs, newest_state


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="llmpipe resume-check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--checkpoints", required=True, help="the backend's checkpoint folder")
    p.add_argument("--init", required=True)
    p.add_argument("--data", required=True, help="the view training reads")
    p.add_argument("--run", required=True)
    p.add_argument("--no-resume", action="store_true", help="train.resume is false: the checkpoints are replaced")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    root = Path(args.checkpoints)
    if not args.no_resume:
        problem = changed_inputs(root, Path(args.init), Path(args.data), args.run)
        if problem:
            raise SystemExit(f"llmpipe resume-check: {problem}")
    # the newest complete step; the trainer verifies its checksums (newest_intact) and falls back if damaged
    found = None if args.no_resume else newest_state(root)
    write_json(args.out, {"resume_from": found[0].name if found else None})
