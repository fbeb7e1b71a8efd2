"""release: push a release folder (llmpipe model-card) to a Hub model repo, private by default.

  llmpipe release --config CFG --folder results/R/release --out results/R/release.json

Creates the repo if needed (hub.release.private, default true), uploads every file of the folder in
one commit through huggingface_hub (HfApi.create_repo + upload_folder), removing in that commit the
repo's files the folder does not hold (an earlier release's: old weights transformers would load before
new shards, data no longer included), and records the repo, the
commit and each file's sha256 in release.json. The token is huggingface_hub's own (HF_TOKEN or the
login cache); it is never an argument, a config key or an output.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from llmpipe.hub import HubError, explain
from llmpipe.io import write_json

log = logging.getLogger(__name__)
SKIP = [".snakemake_timestamp", "*/.snakemake_timestamp"]  # Snakemake's marker in directory outputs


def release(
    folder: str | Path,
    repo_id: str,
    out: str | Path,
    private: bool = True,
    endpoint: str | None = None,
    commit_message: str | None = None,
) -> dict:
    from huggingface_hub import HfApi

    folder = Path(folder)
    files = json.loads((folder / "files.json").read_text())
    api = HfApi(endpoint=endpoint)
    try:
        repo = api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        actual = api.repo_info(repo_id, repo_type="model").private  # create_repo keeps an existing repo's visibility
    except Exception as exc:
        raise HubError(explain(exc, repo_id, None).replace("model ", "release repo ", 1)) from None
    if private and not actual:
        raise HubError(
            f"release repo {repo_id} exists and is public, but hub.release.private is true: nothing was uploaded "
            "(make the repo private on the Hub, or set hub.release.private: false to publish)"
        )
    try:
        info = api.upload_folder(
            repo_id=repo_id,
            repo_type="model",
            folder_path=str(folder),
            ignore_patterns=SKIP,
            delete_patterns="*",  # the commit mirrors the folder: an earlier release's other files go (not .gitattributes)
            commit_message=commit_message or f"llmpipe release ({len(files) + 1} files)",
        )
    except Exception as exc:
        raise HubError(explain(exc, repo_id, None).replace("model ", "release repo ", 1)) from None
    record = {
        "repo_id": repo_id,
        "private": bool(actual),
        "url": str(repo),
        "commit": info.oid,
        "commit_url": info.commit_url,
        "files": files,
    }
    write_json(out, record)
    log.info("released %s to %s at commit %s", folder, repo_id, info.oid)
    return record


def main(argv: list[str] | None = None) -> None:
    from llmpipe import config as cfgmod

    p = argparse.ArgumentParser(prog="llmpipe release", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="reads hub.release and hub.endpoint")
    p.add_argument("--folder", required=True, help="release folder from llmpipe model-card")
    p.add_argument("--out", required=True, help="release.json to write")
    args = p.parse_args(argv)
    cfg = cfgmod.load(args.config)
    rel = cfg["hub"]["release"]
    if not rel["repo_id"]:
        p.error("hub.release.repo_id is not set (org/name of the model repo to push to)")
    try:
        release(args.folder, rel["repo_id"], args.out, rel["private"], cfg["hub"]["endpoint"], rel["commit_message"])
    except HubError as exc:
        print(f"llmpipe release: {exc}", file=sys.stderr)
        sys.exit(1)
