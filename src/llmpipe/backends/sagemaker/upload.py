"""sagemaker-upload: the prepared inputs -> S3, one prefix per channel under <s3_prefix>/<run>/inputs/.

An object whose stored sha256 (object metadata) equals the local file's is not uploaded again;
objects under a channel's prefix that are not in the local folder are deleted, so a channel holds
exactly this run's files. Writes a manifest (channel -> S3 URI, sha256 of every file).

Mode algorithm: channel "train" = the lit-gpt view, files flat (train_*.bin and validation_*.bin side
by side: lit-gpt tells the splits apart by file-name prefix). Mode image: "train" = the hf view
(tree), "init" = the starting checkpoint, "code" = this package's source + the entry script.

  python -m llmpipe sagemaker-upload --config C --view DIR [--init DIR] --out inputs.json
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
from pathlib import Path

from llmpipe import config as cfgmod
from llmpipe.backends.sagemaker import aws
from llmpipe.backends.sagemaker.hyperparameters import check_settings
from llmpipe.io import sha256_file, write_json

log = logging.getLogger(__name__)

PACKAGE = Path(__file__).resolve().parents[2]  # src/llmpipe
ENTRY_SCRIPT = "sagemaker_entry.py"
ENTRY_TEXT = '''"""SageMaker entry point (mode image): runs llmpipe.backends.sagemaker.entry from this channel."""
from llmpipe.backends.sagemaker.entry import main

main()
'''


def local_files(root: Path, flat: bool) -> dict[str, Path]:
    """Relative S3 key -> file; flat drops the folders (names must then be unique)."""
    out: dict[str, Path] = {}
    for p in sorted(q for q in root.rglob("*") if q.is_file() and "__pycache__" not in q.parts):
        rel = p.name if flat else p.relative_to(root).as_posix()
        if rel in out:
            raise ValueError(f"{root}: two files would both be {rel!r} in a flat channel ({out[rel]}, {p})")
        out[rel] = p
    if not out:
        raise ValueError(f"{root}: no files to upload")
    return out


def sync_folder(s3, root: Path, uri: str, flat: bool = False) -> dict:
    """Upload `root` under `uri`; returns {"s3_uri", "files": {key: sha256}, "uploaded", "skipped", "deleted"}."""
    bucket, prefix = aws.split_uri(uri)
    files = local_files(Path(root), flat)
    existing = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            existing[obj["Key"][len(prefix) + 1 :]] = obj["Key"]
    digests, uploaded, skipped = {}, [], []
    for rel, path in files.items():
        digest = digests[rel] = sha256_file(path)
        key = f"{prefix}/{rel}"
        if rel in existing:
            head = s3.head_object(Bucket=bucket, Key=key)
            if head.get("Metadata", {}).get("sha256") == digest and head["ContentLength"] == path.stat().st_size:
                skipped.append(rel)
                continue
        s3.upload_file(str(path), bucket, key, ExtraArgs={"Metadata": {"sha256": digest}})
        uploaded.append(rel)
    stale = sorted(set(existing) - set(files))
    for i in range(0, len(stale), 1000):
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": existing[r]} for r in stale[i : i + 1000]]})
    log.info("%s: %d uploaded, %d already there (same sha256), %d stale deleted", uri, len(uploaded), len(skipped), len(stale))
    return {"s3_uri": uri.rstrip("/") + "/", "files": digests, "uploaded": uploaded, "skipped": skipped, "deleted": stale}


def code_folder(dest: Path) -> Path:
    """This package's source (.py, .yaml) and the entry script, as the mode-image "code" channel."""
    shutil.copytree(PACKAGE, dest / "llmpipe", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (dest / ENTRY_SCRIPT).write_text(ENTRY_TEXT)
    return dest


def upload_inputs(cfg: dict, view: str | Path, init: str | Path | None, out: str | Path, s3=None) -> dict:
    check_settings(cfg)
    sm = cfg["sagemaker"]
    s3 = s3 or aws.clients(sm["region"])["s3"]
    base = aws.join(sm["s3_prefix"], cfg["run"], "inputs")
    channels = {}
    if sm["mode"] == "algorithm":
        channels["train"] = sync_folder(s3, Path(view), aws.join(base, "train"), flat=True)
    else:
        if init is None:
            raise ValueError("sagemaker.mode image needs --init (the starting checkpoint)")
        channels["train"] = sync_folder(s3, Path(view), aws.join(base, "train"))
        channels["init"] = sync_folder(s3, Path(init), aws.join(base, "init"))
        with tempfile.TemporaryDirectory() as tmp:
            channels["code"] = sync_folder(s3, code_folder(Path(tmp)), aws.join(base, "code"))
    view_json = Path(view) / "view.json"
    rows = json.loads(view_json.read_text())["train"]["rows"] if view_json.is_file() else None
    manifest = {
        "mode": sm["mode"],
        "train_rows": rows,
        "channels": {name: {"s3_uri": c["s3_uri"], "files": c["files"]} for name, c in channels.items()},
    }
    write_json(out, manifest)
    return {**manifest, "transfer": {n: {k: c[k] for k in ("uploaded", "skipped", "deleted")} for n, c in channels.items()}}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="llmpipe sagemaker-upload", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", required=True)
    p.add_argument("--view", required=True, help="litgpt view (mode algorithm) or hf view (mode image)")
    p.add_argument("--init", default=None, help="starting HF checkpoint (mode image)")
    p.add_argument("--out", required=True, help="manifest JSON")
    args = p.parse_args(argv)
    upload_inputs(cfgmod.load(args.config), args.view, args.init, args.out)
