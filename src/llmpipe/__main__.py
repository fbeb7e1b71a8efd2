"""llmpipe CLI: every pipeline step, usable without Snakemake.  `llmpipe <command> --help`."""

from __future__ import annotations

import importlib
import logging
import os
import sys

COMMANDS = {
    "get-data": "llmpipe.data.get_data",
    "tokenizer": "llmpipe.data.tokenizer",
    "tokenize": "llmpipe.data.tokenize",
    "token-store": "llmpipe.data.token_store",
    "pack": "llmpipe.data.pack_views",
    "verify": "llmpipe.data.verify",
    "init-model": "llmpipe.model.init",
    "train": "llmpipe.backends.torch.train",
    "launch": "llmpipe.launch",
    "export": "llmpipe.export",
    "evaluate": "llmpipe.evaluate",
    "check-config": "llmpipe.check_config",
    "plan": "llmpipe.plan",
    "report": "llmpipe.report",
}


def fail_once(command: str) -> None:
    """Test hook: LLMPIPE_FAIL_ONCE=<command>:<marker file> makes <command> exit 1 once, the call
    that creates the marker (atomically, so of parallel jobs only one fails); later calls run."""
    target, _, marker = os.environ.get("LLMPIPE_FAIL_ONCE", "").partition(":")
    if target != command or not marker:
        return
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    print(f"llmpipe {command}: failing once on purpose (LLMPIPE_FAIL_ONCE, marker {marker})", file=sys.stderr)
    sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__ + "\n\ncommands:\n" + "\n".join(f"  {c}" for c in COMMANDS), file=sys.stderr)
        sys.exit(0 if argv and argv[0] in ("-h", "--help") else 2)
    fail_once(argv[0])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    main()
