"""llmpipe CLI: every pipeline step, usable without Snakemake.  `llmpipe <command> --help`."""

from __future__ import annotations

import errno
import importlib
import os
import re
import sys

CORE_COMMANDS = {
    "get-data": "llmpipe.data.get_data",
    "tokenizer": "llmpipe.data.tokenizer",
    "tokenize": "llmpipe.data.tokenize",
    "token-store": "llmpipe.data.token_store",
    "pack": "llmpipe.data.pack_views",
    "verify": "llmpipe.data.verify",
    "init-model": "llmpipe.model.init",
    "resume-check": "llmpipe.train.resume_check",
    "launch": "llmpipe.launch",
    "export": "llmpipe.export",
    "evaluate": "llmpipe.evaluate",
    "check-config": "llmpipe.check_config",
    "doctor": "llmpipe.doctor",
    "backends": "llmpipe.backends.cli",
    "plan": "llmpipe.plan.cli",
    "dag": "llmpipe.dag",
    "report": "llmpipe.report",
    "download-model": "llmpipe.hub.download",
    "download-dataset": "llmpipe.hub.datasets",
    "model-card": "llmpipe.hub.card",
    "release": "llmpipe.hub.release",
}
# Steps that do no linear algebra: numpy's OpenBLAS would start a thread per core at import, each spinning
# ~0.1 s of CPU taken from the parallel jobs beside it (measured: a tokenize job's start 0.50 -> 0.37 s CPU).
NO_BLAS_COMMANDS = ("get-data", "tokenizer", "tokenize", "token-store", "pack", "verify")
RENAMED = {"train": "torch-train", "train-colossal": "colossal-train"}  # backend commands are <backend>-<step>


def commands() -> dict[str, str]:
    """The core steps, then each backend's <backend>-<step> commands (llmpipe.backends)."""
    from llmpipe import backends

    return {**CORE_COMMANDS, **backends.commands()}


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
    # a core step needs no backend commands: skips an entry-point scan and the backends' imports (~0.035 s for
    # token-store; ~0.01 s where the config check's schema stamp discovers the backends anyway)
    table = CORE_COMMANDS if argv and argv[0] in CORE_COMMANDS else commands()
    if argv and argv[0] in RENAMED:
        sys.exit(f"llmpipe {argv[0]}: renamed to `llmpipe {RENAMED[argv[0]]}` (backend commands are <backend>-<step>)")
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in table:
        asked = bool(argv) and argv[0] in ("-h", "--help")  # help asked for: stdout (`llmpipe --help | less`)
        out = sys.stdout if asked else sys.stderr
        print(__doc__ + "\n\ncommands:\n" + "\n".join(f"  {c}" for c in table), file=out)
        if argv and not asked:
            import difflib

            near = difflib.get_close_matches(argv[0], list(table), n=1)
            print(f"llmpipe: unknown command {argv[0]!r}" + (f" (did you mean {near[0]!r}?)" if near else ""), file=sys.stderr)
        sys.exit(0 if asked else 2)
    fail_once(argv[0])
    if argv[0] in NO_BLAS_COMMANDS:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy's import; a user's own value stands
    from llmpipe.io import setup_logging  # the standard library only

    setup_logging()
    try:
        importlib.import_module(table[argv[0]]).main(argv[1:])
    except Exception as exc:
        message = storage_error(exc, argv)
        if message is None or os.environ.get("LLMPIPE_DEBUG"):
            raise
        print(f"llmpipe {argv[0]}: error: {message}", file=sys.stderr)
        sys.exit(1)


STORAGE_ERRNOS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
}
# Libraries that lose the errno on a failed write (torch.save: "file write failed").
WRITE_FAILED = ("No space left on device", "file write failed", "Disk quota exceeded")
OUTPUT_FLAGS = ("--out", "--checkpoints", "--metrics", "--markdown")


def storage_error(exc: BaseException, argv: list[str]) -> str | None:
    """One line for a disk-full or permission error anywhere in `exc`'s chain, naming the path
    (the error's own, else the command's output paths); None for any other error."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
            what = STORAGE_ERRNOS[exc.errno]
            path = exc.filename or exc.filename2
            break
        if any(text in str(exc) for text in WRITE_FAILED):
            what, path = "write failed (disk full?)", None
            break
        exc = exc.__cause__ or exc.__context__
    else:
        return None
    outputs = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in OUTPUT_FLAGS]
    where = re.sub(r"/\.([^/]+)\.tmp-\d+(?=/|$)", r"/\1", str(path)) if path else " / ".join(outputs) or os.getcwd()
    full = what in ("no space left on device", "disk quota exceeded") or what.startswith("write failed")
    hint = (
        "free space there or choose another results_dir"
        if full
        else "check that folder's owner, mode and mount, or choose another results_dir"
    )
    return f"{what}: {where} ({hint})"


if __name__ == "__main__":
    main()
