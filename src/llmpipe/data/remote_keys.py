"""Planning-time identity of sources that are not local files, keyed into the DAG (rule get_data's
params) so that a changed source reruns get_data, tokenize and everything after them:
object stores (s3://, gs://, ...: ETag, version id, size, last-modified, as fsspec lists them) and Hub
datasets (`hf:` sources and hub.datasets: the commit their revision points to now). A source that
cannot be reached while planning is keyed by its name only, with one warning naming it: get_data still
records what it read (sources.json), but a later change to it is then not noticed by the plan."""

from __future__ import annotations

import hashlib
import json
import os
import re

import fsspec
from braceexpand import braceexpand

from llmpipe.data.readers import HF_PREFIX

# what changes when an object's bytes do, as fsspec's filesystems name it (HTTP: its response headers)
OBJECT_KEYS = (
    "ETag", "etag", "VersionId", "version_id", "size", "LastModified", "last_modified", "Last-Modified", "mtime",
    "generation", "Content-MD5", "Digest",
)  # fmt: skip
COMMIT = re.compile(r"^[0-9a-f]{40}$")


def is_remote(source: str) -> bool:
    return source.startswith(HF_PREFIX) or ("://" in source and not source.startswith("file://"))


def object_identities(pattern: str) -> list[dict]:
    """Every object a brace/glob pattern names, with what changes when its bytes do."""
    out = []
    for url in braceexpand(pattern):
        fs, path = fsspec.core.url_to_fs(url)
        found = sorted(fs.glob(path)) if any(c in path for c in "*?[") else [path]
        for p in found:
            info = fs.info(p)
            out.append({"source": fs.unstrip_protocol(p), **{k: str(info[k]) for k in OBJECT_KEYS if k in info}})
    return out


def hub_commit(repo: str, revision: str | None, kind: str = "dataset", endpoint: str | None = None) -> str:
    """The commit a Hub revision points to now (a commit hash is its own answer, without the network)."""
    if revision and COMMIT.match(revision):
        return revision
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint)
    info = api.dataset_info if kind == "dataset" else api.model_info
    return info(repo, revision=revision, timeout=10).sha


def remote_identities(sources: list[str], data: dict, datasets: list[dict], endpoint: str | None) -> tuple[list, list[str]]:
    """(identity of each remote source, warnings for those that could not be reached)."""
    ids, warnings = [], []
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    hub = [(s[len(HF_PREFIX) :], data.get("hf_revision")) for s in sources if s.startswith(HF_PREFIX)]
    hub = [(repo, rev) for repo, rev in hub if not os.path.exists(repo)]  # a local folder: its files are inputs
    hub += [(d["id"], d.get("revision")) for d in datasets if not os.path.exists(d["id"])]
    for repo, rev in hub:
        try:
            if offline and not (rev and COMMIT.match(rev)):
                raise ConnectionError("HF_HUB_OFFLINE is set")
            ids.append({"hub": repo, "revision": rev, "commit": hub_commit(repo, rev, endpoint=endpoint)})
        except Exception as exc:  # offline, gated, unknown: planning goes on, the job says what is wrong
            ids.append({"hub": repo, "revision": rev})
            warnings.append(
                f"Hub dataset {repo}@{rev or 'main'}: commit not resolved ({type(exc).__name__}); a change to it will not rerun get_data"
            )
    for src in sources:
        if is_remote(src) and not src.startswith(HF_PREFIX):
            try:
                ids.extend(object_identities(src))
            except Exception as exc:
                ids.append({"source": src})
                warnings.append(
                    f"data source {src}: not listed ({type(exc).__name__}: {exc}); a change to it will not rerun get_data"
                )
    return ids, warnings


def digest(identities: list) -> str:
    return hashlib.sha256(json.dumps(identities, sort_keys=True).encode()).hexdigest()
