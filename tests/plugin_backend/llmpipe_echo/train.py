"""echo-train (TEST DOUBLE): copy the initial model to the output folder, atomically."""

import argparse
import json
import os
import shutil
from pathlib import Path


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe echo-train")
    p.add_argument("--config", required=True)
    p.add_argument("--init", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    copies = json.loads(args.config)["echo"]["copies"]
    out = Path(args.out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    for _ in range(copies):
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(args.init, tmp)
    tmp.rename(out)
