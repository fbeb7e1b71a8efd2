"""check-config: build the config exactly as `snakemake` would (defaults < preset < profile < your files),
validate it against the schema and print it with defaults filled in.

  llmpipe check-config [--profile slurm-trn1] [my.yaml ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from llmpipe import config as cfgmod
from llmpipe import profiles


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="llmpipe check-config", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("config", nargs="*", help="your config YAML/JSON files, in --configfile order")
    p.add_argument("--profile", help="Snakemake profile name or folder (its llmpipe.yaml is a layer)")
    args = p.parse_args(argv)
    try:
        user: dict = {}
        for path in args.config:
            user = profiles.merge(user, profiles._read_yaml(Path(path), "config file"))
        profile = None
        if args.profile:
            found = profiles.snakemake_profiles(["--profile", args.profile])
            if not found:
                raise cfgmod.ConfigError(f"profile {args.profile!r} not found (as Snakemake looks for it)")
            profile = found[0] if (found[0] / profiles.OVERLAY).is_file() else None
        cfg, layers = profiles.layered(user, profile)
        cfgmod.validate(cfg)
    except cfgmod.ConfigError as exc:
        sys.exit(str(exc))
    print("# layers: " + " < ".join(layers))
    print(yaml.safe_dump(cfg, sort_keys=False))
