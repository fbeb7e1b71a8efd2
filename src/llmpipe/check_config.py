"""check-config: validate a config file against the schema and print it with defaults filled in."""

from __future__ import annotations

import argparse
import sys

import yaml

from llmpipe import config as cfgmod


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe check-config", description=__doc__)
    p.add_argument("config", help="config YAML/JSON file")
    args = p.parse_args(argv)
    try:
        cfg = cfgmod.load(args.config)
    except cfgmod.ConfigError as exc:
        sys.exit(str(exc))
    print(yaml.safe_dump(cfg, sort_keys=False))
