"""download-model: a Hub model (org/name[@revision]) or a local folder -> a complete HF model folder.

  llmpipe download-model --model meta-llama/Llama-2-7b-hf@main --out results/default/checkpoints/base

Through huggingface_hub.snapshot_download: only `allow_patterns` files (safetensors weights, JSON
configs, tokenizer files by default: no pickles, no code), into the Hub cache (resumable: an
interrupted run continues its partial blobs), then copied into a temporary folder that is renamed into
place only once complete (every shard of a sharded checkpoint present), with `hub.json` recording the
repo, the revision asked for and the commit hash it resolved to. HF_HUB_OFFLINE=1 works from the
cache. The token is huggingface_hub's own (HF_TOKEN or the login cache); nothing here sees it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from pathlib import Path

from llmpipe.hub import HubError, explain, is_hub_ref, parse_ref
from llmpipe.io import atomic_path, sha256_file, write_json

log = logging.getLogger(__name__)

DEFAULT_PATTERNS = ["*.safetensors", "*.json", "*.txt", "*.model", "*.tiktoken"]
INDEX = "model.safetensors.index.json"


def check_complete(folder: Path, where: str) -> list[str]:
    """The weight files of an HF folder; raises HubError if config, weights or an indexed shard is missing."""
    if not (folder / "config.json").is_file():
        raise HubError(f"{where}: no config.json (is allow_patterns missing '*.json'?)")
    index = folder / INDEX
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise HubError(f"{where}: {len(missing)} of {len(shards)} weight shards missing ({', '.join(missing[:3])})")
        return shards
    weights = sorted(p.name for p in folder.glob("*.safetensors"))
    if not weights:
        raise HubError(
            f"{where}: no *.safetensors weights (pickle checkpoints are not downloaded; "
            "add a pattern to hub.allow_patterns only if you trust the repo)"
        )
    return weights


LINK_MIN_BYTES = 64 << 20  # smaller files are copied: config.json & co. get edited in place (seq_len_past_base)


def _copy_tree(src: Path, dst: Path) -> list[str]:
    """Copy files (symlinks into the Hub cache resolved); hard links for files of LINK_MIN_BYTES or more
    (weights) where the file system allows. A small file is copied: an edit of a run's config.json through
    a link changed the shared cache's blob, so every later download got the edit under the Hub's commit."""
    files = []
    for path in sorted(p for p in src.rglob("*") if p.is_file() and ".cache" not in p.relative_to(src).parts):
        rel = path.relative_to(src)
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        real = path.resolve()
        try:
            if real.stat().st_size < LINK_MIN_BYTES:
                raise OSError("small: copied")
            os.link(real, target)
        except OSError:
            shutil.copyfile(real, target)
        files.append(str(rel))
    return files


def fetch_snapshot(
    ref: str,
    patterns: list[str],
    cache_dir: str | None = None,
    endpoint: str | None = None,
    revision: str | None = None,
    kind: str = "model",
) -> tuple[str, str | None, Path]:
    """(repo id, revision asked for, snapshot folder) of a Hub ref, only `patterns` files, through
    huggingface_hub's cache; its errors become one HubError line naming the fix."""
    from huggingface_hub import snapshot_download

    repo_id, rev = parse_ref(ref, revision)
    try:
        return (
            repo_id,
            rev,
            Path(snapshot_download(repo_id, revision=rev, allow_patterns=patterns, cache_dir=cache_dir, endpoint=endpoint)),
        )
    except Exception as exc:  # huggingface_hub / network errors
        raise HubError(explain(exc, repo_id, rev, kind)) from None


def download_model(
    ref: str,
    out: str | Path,
    revision: str | None = None,
    allow_patterns: list[str] | None = None,
    cache_dir: str | None = None,
    endpoint: str | None = None,
) -> dict:
    """`ref` (Hub id, optionally @revision, or a local folder) -> `out`, complete or not at all."""
    out = Path(out)
    patterns = list(allow_patterns or DEFAULT_PATTERNS)
    if not is_hub_ref(ref):
        src = Path(ref)
        if not src.is_dir():
            raise HubError(f"model {ref!r} is neither a local folder nor a Hub id (org/name[@revision])")
        check_complete(src, ref)
        record = {"source": "local", "path": str(src)}
        snapshot = src
    else:
        repo_id, rev, snapshot = fetch_snapshot(ref, patterns, cache_dir, endpoint, revision)
        check_complete(snapshot, f"{repo_id}@{rev or 'main'}")
        record = {
            "source": "hub",
            "repo_id": repo_id,
            "revision": rev or "main",
            "commit": snapshot.name,
            "allow_patterns": patterns,
        }
    with atomic_path(out) as tmp:
        tmp.mkdir()
        files = _copy_tree(snapshot, tmp)
        weights = check_complete(tmp, str(out))
        record["files"] = {f: {"size": (tmp / f).stat().st_size, "sha256": sha256_file(tmp / f)} for f in files}
        record["weights"] = weights
        write_json(tmp / "hub.json", record)
    log.info("model %s -> %s (%s, %d files)", ref, out, record.get("commit", "local"), len(files))
    return record


def moved_since(base_dir: str | Path, endpoint: str | None = None) -> str | None:
    """One line when the branch (or tag) a downloaded base model (`base_dir`/hub.json) was taken from points to
    another commit now, else None (not downloaded from the Hub yet, pinned to a commit, unmoved, offline, or the
    Hub unreachable). The plan does not download it again: that would retrain from another base mid-run. Asked
    once per planning."""
    from llmpipe.data.remote_keys import hub_commit

    record_file = Path(base_dir) / "hub.json"
    if not record_file.is_file() or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return None
    record = json.loads(record_file.read_text())
    if record.get("source") != "hub":
        return None
    try:
        now = hub_commit(record["repo_id"], record["revision"], "model", endpoint)
    except Exception:  # no answer: the plan goes on with the model it has
        return None
    if now == record["commit"]:
        return None
    where = f"{record['repo_id']}@{record['revision']}"
    return (
        f"{where} points to commit {now} now; {base_dir} holds {record['commit']}, which this run keeps training "
        f"from. To take the new one, remove {base_dir}: the next run downloads it, and checkpoints trained from the "
        f"old one stop training until you restart (train.resume false) or name a new run. To keep the old one "
        f"quietly, pin model.init_from to {record['repo_id']}@{record['commit']}"
    )


def main(argv: list[str] | None = None) -> None:
    from llmpipe import config as cfgmod

    p = argparse.ArgumentParser(
        prog="llmpipe download-model", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", help="org/name[@revision], hf://org/name, or a local folder (default: model.init_from)")
    p.add_argument("--config", help="config (reads model.init_from and hub.*)")
    p.add_argument("--revision", help="branch, tag or commit (an @revision in --model wins)")
    p.add_argument("--out", required=True, help="folder to write")
    args = p.parse_args(argv)
    cfg = cfgmod.load(args.config) if args.config else cfgmod.load(None)
    hub = cfg["hub"]
    ref = args.model or cfg["model"]["init_from"]
    if not ref:
        p.error("no --model and no model.init_from in the config")
    try:
        download_model(ref, args.out, args.revision or hub["revision"], hub["allow_patterns"], hub["cache_dir"], hub["endpoint"])
    except HubError as exc:
        print(f"llmpipe download-model: {exc}", file=sys.stderr)
        sys.exit(1)
