"""levanter-cache: our token store -> Levanter's cache, written with Levanter's own SerialCacheWriter.

One cache row per document (its tokens exactly as the store holds them, EOS included), in store order:
<out>/train/ and <out>/validation/ (shard_ledger.json + input_ids/{offsets,data}) and cache.json
(the store's fingerprint and token counts). No second tokenization: Levanter trains on these tokens.
Runs in the Levanter environment.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np

from llmpipe.backends.levanter import require_levanter
from llmpipe.data.token_store import TokenStore
from llmpipe.io import atomic_path, write_json

log = logging.getLogger(__name__)

SPLITS = {"train": "train", "val": "validation"}  # our split -> Levanter's split folder
DOCS_PER_BATCH = 1024


def write_split(store: TokenStore, split: str, folder: Path) -> dict:
    from levanter.store.cache import CacheMetadata, SerialCacheWriter

    stream = store.split(split)
    starts = np.append(stream.doc_starts(), stream.size)
    meta = CacheMetadata(preprocessor_metadata={"llmpipe_token_store": store.manifest["fingerprint"], "split": split})
    exemplar = {"input_ids": np.zeros((0,), dtype=np.int32)}
    with SerialCacheWriter(str(folder), exemplar, metadata=meta) as writer:
        for i in range(0, len(starts) - 1, DOCS_PER_BATCH):
            j = min(i + DOCS_PER_BATCH, len(starts) - 1)
            tokens = stream.read(int(starts[i]), int(starts[j])).astype(np.int32)
            writer.write_batch(
                [{"input_ids": tokens[a - starts[i] : b - starts[i]]} for a, b in zip(starts[i:j], starts[i + 1 : j + 1])]
            )
    return {"documents": len(starts) - 1, "tokens": stream.size}


def write_cache(manifest: str | Path, out: str | Path) -> dict:
    require_levanter()
    store = TokenStore(manifest)
    info = {"store": str(manifest), "fingerprint": store.manifest["fingerprint"], "splits": {}}
    with atomic_path(out) as tmp:
        for split, folder in SPLITS.items():
            info["splits"][folder] = write_split(store, split, tmp / folder)
            log.info("levanter cache %s: %s", folder, info["splits"][folder])
        write_json(tmp / "cache.json", info)
    return info


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe levanter-cache", description=__doc__)
    p.add_argument("--store", required=True, help="token store manifest.json")
    p.add_argument("--out", required=True, help="cache folder to write")
    args = p.parse_args(argv)
    write_cache(args.store, args.out)
