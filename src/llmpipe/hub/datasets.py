"""download-dataset: a Hub dataset (or a local dataset folder) materialised as one Parquet file first,
as the seeds save SlimPajama splits to disk before training; split slicing as `datasets` writes it
(`train[:10%]`, `train[1000:2000]`, `train[:5%]+validation`).

  llmpipe download-dataset --id cerebras/SlimPajama-627B --split 'train[:1%]' --out results/default/data/hub/slim.parquet

List the Parquet path in data.sources (plain or weighted). Written atomically with `<out>.json` beside
it (id, config, split, revision asked for and resolved commit when known, rows, sha256).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from llmpipe.hub import HubError, explain
from llmpipe.io import atomic_path, sha256_file, write_json

log = logging.getLogger(__name__)


def download_dataset(
    dataset_id: str,
    out: str | Path,
    config: str | None = None,
    split: str = "train",
    revision: str | None = None,
    text_field: str | None = None,
    endpoint: str | None = None,
) -> dict:
    endpoint = endpoint.rstrip("/") if endpoint else None
    if endpoint:  # hub.endpoint: datasets and huggingface_hub read it once, when imported
        os.environ["HF_ENDPOINT"] = endpoint
    import datasets
    from huggingface_hub import constants

    if endpoint and constants.ENDPOINT != endpoint:
        raise HubError(f"hub.endpoint {endpoint}: huggingface_hub was imported before it was set (endpoint {constants.ENDPOINT})")
    out = Path(out)
    try:
        ds = datasets.load_dataset(dataset_id, config, split=split, revision=revision)
    except Exception as exc:  # hub errors in one line; a bad split spec names itself
        if isinstance(exc, ValueError) and ("split" in str(exc).lower() or "instruction" in str(exc).lower()):
            raise HubError(f"dataset {dataset_id}: bad split {split!r}: {str(exc).splitlines()[0]}") from None
        raise HubError(explain(exc, dataset_id, revision, kind="dataset")) from None
    if isinstance(ds, datasets.DatasetDict):  # not reached with a split, kept for clarity
        raise HubError(f"dataset {dataset_id}: give one split expression, got {list(ds)}")
    if text_field and text_field not in ds.column_names:
        raise HubError(
            f"dataset {dataset_id} split {split!r} has no {text_field!r} column "
            f"(columns: {', '.join(ds.column_names)}); set data.text_field"
        )
    commit = None
    if not Path(dataset_id).exists():
        try:
            from huggingface_hub import HfApi

            commit = HfApi(endpoint=endpoint).dataset_info(dataset_id, revision=revision).sha
        except Exception as exc:  # offline: the cache served it; the commit stays unknown
            log.info("dataset commit not resolved (%s)", type(exc).__name__)
    with atomic_path(out) as tmp:
        ds.to_parquet(str(tmp))
    record = {
        "id": dataset_id,
        "config": config,
        "split": split,
        "revision": revision,
        "commit": commit,
        "rows": ds.num_rows,
        "columns": ds.column_names,
        "sha256": sha256_file(out),
        "bytes": out.stat().st_size,
    }
    write_json(out.with_name(out.name + ".json"), record)
    log.info("dataset %s[%s] -> %s: %d rows", dataset_id, split, out, ds.num_rows)
    return record


def main(argv: list[str] | None = None) -> None:
    from llmpipe import config as cfgmod

    p = argparse.ArgumentParser(
        prog="llmpipe download-dataset", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", help="config: with --name, reads hub.datasets[name] (and data.text_field)")
    p.add_argument("--name", help="entry of hub.datasets")
    p.add_argument("--id", help="Hub dataset id or local dataset folder")
    p.add_argument("--hf-config", help="dataset configuration name")
    p.add_argument("--split", default="train", help="split expression, e.g. 'train[:10%%]'")
    p.add_argument("--revision")
    p.add_argument("--out", required=True, help="Parquet file to write")
    args = p.parse_args(argv)
    text_field = endpoint = None
    if args.name:
        cfg = cfgmod.load(args.config) if args.config else cfgmod.load(None)
        entries = {e["name"]: e for e in cfg["hub"]["datasets"]}
        if args.name not in entries:
            p.error(f"no hub.datasets entry named {args.name!r} (have: {', '.join(entries) or 'none'})")
        e = entries[args.name]
        spec = (e["id"], e["config"], e["split"], e["revision"])
        text_field, endpoint = cfg["data"]["text_field"], cfg["hub"]["endpoint"]
    elif args.id:
        spec = (args.id, args.hf_config, args.split, args.revision)
    else:
        p.error("give --id, or --config with --name")
    try:
        download_dataset(spec[0], args.out, spec[1], spec[2], spec[3], text_field, endpoint)
    except HubError as exc:
        print(f"llmpipe download-dataset: {exc}", file=sys.stderr)
        sys.exit(1)
