"""check-config: build the config exactly as `snakemake` would (defaults < preset < profile < your files
< --config), validate it against the schema and print it with defaults filled in.

  llmpipe check-config [--profile slurm-trn1] [my.yaml ...] [--config 'train={max_steps: 160}' run=exp2 ...]

--config takes what `snakemake --config` takes, typed by the schema as the workflow types it
(llmpipe.overrides), and dotted keys too (train.max_steps=160), which Snakemake itself refuses: the
Snakemake form is printed with the config. A run name already used for another model, tokenizer or
backend (results/<run>/run-identity.json, from this folder) is refused as `snakemake` refuses it.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import yaml

from llmpipe import config as cfgmod
from llmpipe import overrides, profiles, run_identity


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="llmpipe check-config", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("config", nargs="*", help="your config YAML/JSON files, in --configfile order")
    p.add_argument("--profile", help="Snakemake profile name or folder (its llmpipe.yaml is a layer)")
    p.add_argument(
        "--config",
        dest="overrides",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="overrides as snakemake --config takes them (train={max_steps: 160}), or dotted (train.max_steps=160)",
    )
    args = p.parse_args(argv)
    try:
        user: dict = {}
        for path in args.config:
            user = profiles.merge(user, profiles._read_yaml(Path(path), "config file"))
        cli = overrides.from_entries(args.overrides)
        user = profiles.merge(user, cli)
        profile = None
        if args.profile:
            found = profiles.profile_dir(args.profile)
            profile = found if (found / profiles.OVERLAY).is_file() else None
        cfg, layers = profiles.layered(user, profile)
        cfgmod.validate(cfg)
        clash = run_identity.clash(cfg, cfgmod.run_dir(cfg))
        if clash:
            raise cfgmod.ConfigError(clash)
    except cfgmod.ConfigError as exc:
        sys.exit(str(exc))
    print("# layers: " + " < ".join(layers))
    if any("." in e.partition("=")[0] for e in args.overrides):
        print("# as snakemake --config (which refuses dotted keys): " + " ".join(map(shlex.quote, overrides.snakemake_form(cli))))
    print(yaml.safe_dump(cfg, sort_keys=False))
