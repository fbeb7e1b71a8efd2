"""pack (gather): build one backend view of the token store -> <views>/<format>/ + view.json."""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import logging
from pathlib import Path

from llmpipe import config as cfgmod
from llmpipe.data.token_store import TokenStore
from llmpipe.data.tokenizer import check_same_tokenizer
from llmpipe.data.views import FORMATS
from llmpipe.io import atomic_path, write_json

log = logging.getLogger(__name__)


ROWS = ("remainder", "val_remainder", "shuffle", "shuffle_seed")
# the data keys each format's files depend on, besides the store (and train.seq_len where PACKED)
FORMAT_KEYS = {"hf": (*ROWS, "segment_ids"), "litgpt": (*ROWS, "litgpt_sequences_per_file"), "megatron": ()}
PACKED = ("hf", "litgpt")  # rows of seq_len tokens; megatron's documents are whole
VIEW_KEYS = tuple(dict.fromkeys(k for keys in FORMAT_KEYS.values() for k in keys))  # read by pack and verify only


def view_key(store: TokenStore, fmt: str, cfg: dict) -> str:
    """What a view's files depend on: the store's content and this format's packing parameters, so a
    setting of another format leaves it (and a run resuming on it) alone."""
    params = {k: cfg["data"][k] for k in FORMAT_KEYS[fmt]}
    params.update(format=fmt, seq_len=cfg["train"]["seq_len"] if fmt in PACKED else None)
    return hashlib.sha256(f"{store.manifest['fingerprint']}:{json.dumps(params, sort_keys=True)}".encode()).hexdigest()


def build_view(manifest: str | Path, fmt: str, out_dir: str | Path, cfg: dict, tokenizer_dir: str | Path | None = None) -> dict:
    if fmt not in FORMATS:
        raise ValueError(f"unknown view format {fmt!r}; available: {', '.join(FORMATS)}")
    store = TokenStore(manifest)
    if tokenizer_dir is not None:
        check_same_tokenizer(tokenizer_dir, store.manifest["tokenizer"]["sha256"], f"token store {manifest}")
    module = importlib.import_module(f"llmpipe.data.views.{fmt}")
    with atomic_path(out_dir) as tmp:
        stats = module.write(store, tmp, cfg)
        info = {
            "format": fmt,
            "seq_len": cfg["train"]["seq_len"] if fmt in PACKED else None,
            "store_fingerprint": store.manifest["fingerprint"],
            "fingerprint": view_key(store, fmt, cfg),
            "eos_id": store.eos_id,
            "tokenizer_sha256": store.manifest["tokenizer"]["sha256"],
            **stats,
        }
        write_json(tmp / "view.json", info)
    log.info("%s view %s: %s", fmt, out_dir, stats)
    return info


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe pack", description=__doc__)
    p.add_argument("--config", required=True)
    p.add_argument("--store", required=True, help="token store manifest.json")
    p.add_argument("--format", default="hf", choices=FORMATS)
    p.add_argument("--tokenizer", help="tokenizer folder the store must have been made with")
    p.add_argument("--out", required=True, help="view folder to write")
    args = p.parse_args(argv)
    try:
        build_view(args.store, args.format, args.out, cfgmod.load(args.config), args.tokenizer)
    except ValueError as exc:  # a split without one row, another tokenizer: one line
        raise SystemExit(f"llmpipe pack: error: {exc}") from None
