"""get_data: resolve the corpus sources (braces, globs, URLs, HF ids) and fingerprint them -> sources.json.

The tokenize shards stream straight from these sources (no intermediate copy); the fingerprints
key every later output to the exact input bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
from pathlib import Path

from llmpipe import config as cfgmod
from llmpipe.data import mixture
from llmpipe.data.readers import HF_PREFIX, BadSource
from llmpipe.data.sources import describe, expand_sources, local_stat
from llmpipe.io import write_json

log = logging.getLogger(__name__)


def unusable(source: str) -> str | None:
    """Why a local source can give no documents (a directory, unreadable, 0 bytes), or None."""
    if source.startswith(HF_PREFIX) or "://" in source and not source.startswith("file://"):
        return None  # remote: found out while reading (tokenize counts or names it)
    path = source.removeprefix("file://")
    if os.path.isdir(path):
        return "is a directory, not a file"
    if not os.access(path, os.R_OK):
        return "is not readable (permission denied)"
    if os.path.getsize(path) == 0:
        return "is empty (0 bytes)"
    return None


def check_sources(sources: list[str], policy: str) -> dict[str, str]:
    """Stop at the first unusable local source, naming it (on_bad_record: fail), or log each (skip: the
    tokenize jobs count it in the read stats); with no usable source at all, stop either way.
    Returns {unusable source: why}."""
    bad = {s: why for s in sources if (why := unusable(s))}
    for source, why in bad.items():
        if policy == "fail":
            raise BadSource("unreadable_source", source, f"data source {why} (on_bad_record: skip would count and skip it)")
        log.warning("data source %s %s: skipped (on_bad_record: skip), counted in the read stats", source, why)
    if sources and len(bad) == len(sources):
        raise BadSource("unreadable_source", ", ".join(bad), "no usable data source: " + "; ".join(bad.values()))
    return bad


def get_data(data_cfg: dict, out: str | Path) -> dict:
    mix = None
    if mixture.is_mixture(data_cfg["sources"]):  # weighted sources: groups counted, sampling rates set
        sources, mix = mixture.plan(data_cfg)
    else:
        sources = expand_sources(data_cfg["sources"])
    bad = check_sources(sources, data_cfg["on_bad_record"])
    cache = Path(out).with_name(".sources-hashes.json")  # not an output: survives Snakemake's delete
    known = json.loads(cache.read_text()) if cache.is_file() else {}
    # skip: a directory or unreadable file stays listed (the tokenize jobs count it) but cannot be hashed
    entries = [{"source": s, "unusable": bad[s]} if s in bad and "0 bytes" not in bad[s] else describe(s, known) for s in sources]
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
    try:
        get_data(cfgmod.load(args.config)["data"], args.out)
    except BadSource as exc:  # one line naming the file, no traceback
        raise SystemExit(f"llmpipe get-data: error: {exc}") from None
