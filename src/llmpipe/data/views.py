"""Backend views built from the token store. `hf`: datasets.save_to_disk folders train/ and val/
with `input_ids`, `attention_mask`, `labels`, each exactly seq_len long (NxD's and our torch loader's format)."""

from __future__ import annotations

import argparse
import hashlib
import logging
from pathlib import Path

import pyarrow as pa

from llmpipe import config as cfgmod
from llmpipe.data.pack import Packed, pack
from llmpipe.data.token_store import TokenStore
from llmpipe.io import atomic_path, write_json

log = logging.getLogger(__name__)


def _dataset(packed: Packed):
    import datasets

    def column(a):
        return pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1)), a.shape[1])

    table = pa.table({"input_ids": column(packed.input_ids), "attention_mask": column(packed.attention_mask),
                      "labels": column(packed.labels)})
    return datasets.Dataset(table)


def write_hf_view(manifest: str | Path, out_dir: str | Path, seq_len: int, remainder: str, val_remainder: str) -> dict:
    store = TokenStore(manifest)
    stats = {"seq_len": seq_len, "store_fingerprint": store.manifest["fingerprint"]}
    with atomic_path(out_dir) as tmp:
        for split, policy in (("train", remainder), ("val", val_remainder)):
            packed = pack(store.tokens(split), seq_len, policy, pad_id=store.eos_id)
            if packed.stats["rows"] == 0:
                raise ValueError(f"{split} split has {packed.stats['tokens_in']} tokens: not one row of seq_len {seq_len}")
            _dataset(packed).save_to_disk(str(tmp / split))
            stats[split] = {"remainder": policy, **packed.stats}
        key = f"{stats['store_fingerprint']}:{seq_len}:{remainder}:{val_remainder}"
        stats["fingerprint"] = hashlib.sha256(key.encode()).hexdigest()
        write_json(tmp / "view.json", stats)
    log.info("hf view %s: %s", out_dir, stats)
    return stats


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe pack", description=__doc__)
    p.add_argument("--config", required=True)
    p.add_argument("--store", required=True, help="token store manifest.json")
    p.add_argument("--out", required=True, help="view folder to write")
    args = p.parse_args(argv)
    cfg = cfgmod.load(args.config)
    write_hf_view(args.store, args.out, cfg["train"]["seq_len"], cfg["data"]["remainder"], cfg["data"]["val_remainder"])
