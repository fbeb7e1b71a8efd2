"""get_data: resolve the corpus sources (braces, globs, URLs, HF ids) and describe them -> sources.json.

The tokenize shards stream straight from these sources (no intermediate copy). No source byte is read here
but one: local files are described by path and size (their sha256 is taken by the tokenize jobs as they read
them, tokenize.source_checksums), remote ones by size and ETag / mtime. With fewer sources than data.num_shards,
a local plain JSONL file of at least data.range_split_bytes is cut here into one byte range per shard at line
starts ("ranges" of its entry, so they key every later output too): each tokenize job reads only its own, and its
documents are identified by their lines' byte offsets. Finding a cut reads from its target to the next line end
(counted as "scanned" and in the store's source_reads; cached while the file is unchanged).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from llmpipe import config as cfgmod
from llmpipe.data import mixture
from llmpipe.data.cuts import cuttable, has_record, split_points, splits
from llmpipe.data.readers import HF_PREFIX, BadSource, source_format, unsupported
from llmpipe.data.sources import describe, expand_sources, local_stat, refuse_repeats, split_source
from llmpipe.io import write_json

log = logging.getLogger(__name__)
CUT_RULES = 2  # which files cuts.cuttable cuts (2: not one starting as an array); a cached cut made by other rules is redone


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


def get_data(data_cfg: dict, out: str | Path, threads: int = 1) -> dict:
    """sources.json for data.sources; `threads`: processes counting a mixture's files at once."""
    Path(out).unlink(missing_ok=True)  # a run that fails leaves no earlier sources.json looking current
    mix = None
    if mixture.is_mixture(data_cfg["sources"]):  # weighted sources: groups counted, sampling rates set
        sources, mix = mixture.plan(data_cfg, threads)
    else:
        sources = expand_sources(data_cfg["sources"])
    refuse_repeats(sources)
    bad = check_sources(sources, data_cfg["on_bad_record"])
    unknown = [s for s in sources if s not in bad and source_format(s) is None]
    if unknown:  # a config mistake, whatever on_bad_record says: named here, not by a tokenize job later
        raise ValueError(unsupported(unknown[0]) + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""))
    cache = Path(out).with_name(".sources-cuts.json")  # not an output: survives Snakemake's delete
    known = json.loads(cache.read_text()) if cache.is_file() else {}
    # skip: a directory or unreadable file stays listed (the tokenize jobs count it); no source is read here
    # (the tokenize jobs take each local file's sha256 as they read it: one read per byte)
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:  # remote objects: one request each, at once
        entries = list(
            pool.map(
                lambda s: {"source": s, "unusable": bad[s]} if s in bad and "0 bytes" not in bad[s] else describe(s), sources
            )
        )
    local, scanned = {}, {}
    n, split = data_cfg["num_shards"], splits(data_cfg, sources, bad)
    for entry in entries:
        if entry["source"] not in split:
            continue
        seen, stat = known.get(entry["source"], {}), local_stat(entry["source"])
        if seen.get("stat") == stat and seen.get("ranges", {}).get("shards") == n and seen.get("rules") == CUT_RULES:
            ranges = seen["ranges"]["at"]  # unchanged file, same shard count: the same cut
        else:  # reads up to the first record byte, then from each target to the next line end: counted
            first, scanned[entry["source"]] = has_record(entry["source"])
            if not cuttable(first):  # blank (its readers name it empty_source) or an array: read whole
                continue
            ranges, more = split_points(entry["source"], n)
            scanned[entry["source"]] += more
            log.info("%s: %d bytes cut into %d byte ranges at line starts", entry["source"], entry["size"], n)
        mine = local[entry["source"]] = {"stat": stat, "rules": CUT_RULES}
        if ranges[-1] != entry["size"]:
            raise BadSource("damaged_source", entry["source"], f"changed while get-data read it ({ranges[-1]} bytes)")
        entry["ranges"] = ranges  # the byte offset where each shard's range starts, then the end
        mine["ranges"] = {"shards": n, "at": ranges}
    write_json(cache, local)
    if mix:
        for entry, g in zip(entries, mix["group_of_source"]):
            entry["group"] = mix["groups"][g]["name"]
    keyed = entries if mix is None else {"sources": entries, "mixture": mix}
    key = hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()
    # "spec": data.sources as configured (not in the key: the entries are what was found); tokenize checks it
    # "scanned": bytes read here (the byte-range cut's pass), not in the key: a cached cut reads none
    manifest = {
        "sources": entries,
        "key": key,
        **({"mixture": mix} if mix else {}),
        "spec": data_cfg["sources"],
        "scanned": scanned,
    }
    write_json(out, manifest)
    log.info("%d sources, %s bytes, key %s", len(entries), sum(e.get("size") or 0 for e in entries), key[:12])
    return manifest


def read_sources(path: str | Path, data_cfg: dict | None = None) -> tuple[list, dict]:
    """(the sources' names, as load_sources gives them; the whole sources.json): one parse for a job that
    needs its key, mixture or entries too. `data_cfg`: the job's data section, whose data.sources must be the
    one get-data resolved (else ValueError: a sources.json of another config)."""
    manifest = json.loads(Path(path).read_text())
    if data_cfg is not None and "spec" in manifest and manifest["spec"] != data_cfg["sources"]:
        raise ValueError(
            f"{path} was written by get-data for data.sources {json.dumps(manifest['spec'])[:300]}, not this config's "
            f"{json.dumps(data_cfg['sources'])[:300]}: run get-data again with this config"
        )
    names = [split_source(e["source"], e["ranges"], e["size"]) if "ranges" in e else e["source"] for e in manifest["sources"]]
    return names, manifest


def load_sources(path: str | Path) -> list:
    """The sources' names; one split into byte ranges comes as a sources.Source carrying them (see assign)."""
    return read_sources(path)[0]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe get-data", description=__doc__)
    p.add_argument("--config", required=True, help="config YAML/JSON file or inline JSON")
    p.add_argument("--out", required=True, help="sources.json to write")
    p.add_argument("--threads", type=int, default=1, help="weighted sources: processes counting their files at once")
    args = p.parse_args(argv)
    try:
        get_data(cfgmod.load(args.config)["data"], args.out, args.threads)
    except (BadSource, ValueError, FileNotFoundError) as exc:  # one line naming the file (a glob matching nothing), no traceback
        raise SystemExit(f"llmpipe get-data: error: {exc}") from None
    except Exception as exc:
        if (why := remote_refusal(exc)) is None:
            raise
        raise SystemExit(f"llmpipe get-data: error: {why}") from None


def remote_refusal(exc: BaseException) -> str | None:
    """One line for a remote store refusing to list or describe the sources (no credentials, access denied),
    or None for any other error."""
    name = type(exc).__name__
    if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):  # botocore
        return (
            f"no usable AWS credentials to read data.sources ({name}: {exc}): set AWS_PROFILE (or log in: aws sso login) "
            "or the AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY environment, or an instance role"
        )
    if isinstance(exc, PermissionError) and exc.errno is None:  # s3fs / gcsfs: the store said 403
        return f"the store refused access to data.sources ({name}: {exc}): check the credentials' read and list permissions"
    return None
