"""Token store (gather): the canonical tokens, written once by the tokenize shards, indexed by manifest.json.

Layout of <store>/: shard-XXXXX.safetensors (per split: `<split>.tokens` flat ids with EOS after every
document, `<split>.offsets` document boundaries, `<split>.doc_ids`) + manifest.json (shard order,
counts, tokenizer fingerprint). Every backend view is built from this store.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
from pathlib import Path
from typing import Iterator

import numpy as np
from safetensors import safe_open

from llmpipe.io import write_json

log = logging.getLogger(__name__)

FORMAT = "llmpipe-token-store/1"


def _shard_meta(path: Path) -> dict:
    with safe_open(str(path), framework="numpy") as f:
        return f.metadata()


def build_manifest(shards: list[str | Path], out: str | Path) -> dict:
    shards = [Path(s) for s in shards]
    out = Path(out)
    entries, tokenizer, totals = [], None, {"train": {"documents": 0, "tokens": 0}, "val": {"documents": 0, "tokens": 0}}
    digest = hashlib.sha256()
    for path in shards:
        if path.parent.resolve() != out.parent.resolve():
            raise ValueError(f"token shard {path} is not inside the store folder {out.parent}")
        meta = _shard_meta(path)
        tok = {k: meta[k] for k in ("tokenizer_sha256", "eos_id", "bos_id", "vocab_size")}
        if tokenizer is None:
            tokenizer = tok
        elif tok != tokenizer:
            raise ValueError(f"token shard {path} was made with a different tokenizer setup ({tok} vs {tokenizer})")
        counts = json.loads(meta["counts"])
        for split, c in counts.items():
            for k in ("documents", "tokens"):
                totals[split][k] += c[k]
        entries.append({"file": path.name, "counts": counts})
        digest.update(path.name.encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    manifest = {
        "format": FORMAT,
        "tokenizer": {"sha256": tokenizer["tokenizer_sha256"], "eos_id": int(tokenizer["eos_id"]),
                      "bos_id": int(tokenizer["bos_id"]), "vocab_size": int(tokenizer["vocab_size"])},
        "shards": entries,
        "totals": totals,
        "fingerprint": digest.hexdigest(),
    }
    write_json(out, manifest)
    log.info("token store %s: %s", out.parent, totals)
    return manifest


class TokenStore:
    """Read access to a token store through its manifest."""

    def __init__(self, manifest: str | Path):
        self.manifest_path = Path(manifest)
        self.root = self.manifest_path.parent
        self.manifest = json.loads(self.manifest_path.read_text())
        if self.manifest.get("format") != FORMAT:
            raise ValueError(f"{manifest}: not a {FORMAT} manifest")

    @property
    def eos_id(self) -> int:
        return self.manifest["tokenizer"]["eos_id"]

    def shard_arrays(self, split: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(tokens, offsets) of every shard, in manifest order."""
        for entry in self.manifest["shards"]:
            with safe_open(str(self.root / entry["file"]), framework="numpy") as f:
                yield f.get_tensor(f"{split}.tokens"), f.get_tensor(f"{split}.offsets")

    def tokens(self, split: str) -> np.ndarray:
        """The split's whole token stream (documents + EOS, in store order)."""
        arrays = [t for t, _ in self.shard_arrays(split)]
        return np.concatenate(arrays) if arrays else np.zeros(0, np.uint32)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe token-store", description=__doc__)
    p.add_argument("--shards", nargs="+", required=True, help="token shards, in order")
    p.add_argument("--out", required=True, help="manifest.json to write (beside the shards)")
    args = p.parse_args(argv)
    build_manifest(args.shards, args.out)
