"""get_data: resolve the corpus sources (braces, globs, URLs, HF ids) and fingerprint them -> sources.json.

The tokenize shards stream straight from these sources (no intermediate copy); the fingerprints
key every later output to the exact input bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
from pathlib import Path

from llmpipe import config as cfgmod
from llmpipe.data import mixture
from llmpipe.data.sources import describe, expand_sources, local_stat
from llmpipe.io import write_json

log = logging.getLogger(__name__)


def get_data(data_cfg: dict, out: str | Path) -> dict:
    mix = None
    if mixture.is_mixture(data_cfg["sources"]):  # weighted sources: groups counted, sampling rates set
        sources, mix = mixture.plan(data_cfg)
    else:
        sources = expand_sources(data_cfg["sources"])
    cache = Path(out).with_name(".sources-hashes.json")  # not an output: survives Snakemake's delete
    known = json.loads(cache.read_text()) if cache.is_file() else {}
    entries = [describe(s, known) for s in sources]
    local = {e["source"]: {"stat": local_stat(e["source"]), "sha256": e["sha256"]} for e in entries if "sha256" in e}
    rehashed = sum(1 for s, v in local.items() if known.get(s) != v)
    write_json(cache, local)
    if mix:
        for entry, g in zip(entries, mix["group_of_source"]):
            entry["group"] = mix["groups"][g]["name"]
    keyed = entries if mix is None else {"sources": entries, "mixture": mix}
    key = hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()
    manifest = {"sources": entries, "key": key, **({"mixture": mix} if mix else {})}
    write_json(out, manifest)
    log.info(
        "%d sources, %s bytes, key %s; %d local file(s) hashed, %d unchanged (size, mtime, ctime, inode)",
        len(entries),
        sum(e.get("size") or 0 for e in entries),
        key[:12],
        rehashed,
        len(local) - rehashed,
    )
    return manifest


def load_sources(path: str | Path) -> list[str]:
    return [e["source"] for e in json.loads(Path(path).read_text())["sources"]]


def sources_key(path: str | Path) -> str:
    return json.loads(Path(path).read_text())["key"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe get-data", description=__doc__)
    p.add_argument("--config", required=True, help="config YAML/JSON file or inline JSON")
    p.add_argument("--out", required=True, help="sources.json to write")
    args = p.parse_args(argv)
    get_data(cfgmod.load(args.config)["data"], args.out)
