"""verify: re-read the token store and every view, prove token conservation, re-tokenize a sample of
documents with the HF tokenizer, and write the run's data stats (counts, skips, sha256 of every file)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np

from llmpipe.data import mixture
from llmpipe.data.pack import Layout, order
from llmpipe.data.readers import ReadStats, documents
from llmpipe.data.sources import assign, doc_id
from llmpipe.data.token_store import SPLITS, TokenStore
from llmpipe.data.views.litgpt import read_file
from llmpipe.io import sha256_file, write_json

log = logging.getLogger(__name__)


class VerifyError(AssertionError):
    pass


def _expected_real(stream, layout: Layout) -> np.ndarray:
    """The real (non-pad) tokens the rows must hold, in stream order."""
    parts = [stream.read(a, b) for i in range(layout.rows) for a, b in layout.spans(i)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _check(name: str, got: np.ndarray, want: np.ndarray) -> None:
    if got.size != want.size or not np.array_equal(got, want):
        raise VerifyError(f"{name}: the view's tokens differ from the token store ({got.size} vs {want.size} tokens)")


def verify_hf(store: TokenStore, view: Path, info: dict) -> dict:
    import datasets

    out = {}
    for split in SPLITS:
        s = info[split]
        stream = store.split(split)
        layout = Layout(stream.size, info["seq_len"], s["remainder"])
        ds = datasets.load_from_disk(str(view / split)).with_format("numpy")
        perm = order(layout.rows, s["shuffle"], s["seed"])
        if len(ds) != layout.rows:
            raise VerifyError(f"hf/{split}: {len(ds)} rows, layout says {layout.rows}")
        inverse = np.argsort(perm)  # stream row i sits at position inverse[i]
        rows = ds[:]
        ids, mask, labels = rows["input_ids"][inverse], rows["attention_mask"][inverse], rows["labels"][inverse]
        if not np.array_equal(labels[mask == 1], ids[mask == 1]) or not (labels[mask == 0] == -100).all():
            raise VerifyError(f"hf/{split}: labels do not mirror input_ids on real tokens / -100 on padding")
        _check(f"hf/{split}", ids[mask == 1].astype(np.int64), _expected_real(stream, layout))
        out[split] = {"rows": layout.rows, "tokens_checked": int(mask.sum())}
    return out


def verify_litgpt(store: TokenStore, view: Path, info: dict) -> dict:
    out = {}
    for split, folder in (("train", "train"), ("val", "validation")):
        s = info[split]
        stream = store.split(split)
        layout = Layout(stream.size, s["block"], s["remainder"])
        files = sorted((view / folder).glob("*.bin"))
        blocks = np.concatenate([read_file(f).astype(np.int64) for f in files]).reshape(-1, s["block"])
        if not (blocks[layout.rows :] == store.eos_id).all():
            raise VerifyError(f"litgpt/{split}: file padding is not the pad token")
        ordered = blocks[: layout.rows][np.argsort(order(layout.rows, s["shuffle"], s["seed"]))].reshape(-1)
        real = ordered[: layout.stats()["tokens_packed"]]
        _check(f"litgpt/{split}", real, _expected_real(stream, layout))
        out[split] = {"files": len(files), "tokens_checked": int(real.size)}
    return out


def verify_megatron(store: TokenStore, view: Path, info: dict) -> dict:
    from llmpipe.data.views.megatron import read

    out = {}
    for split in SPLITS:
        tokens, lengths = read(view / info[split]["prefix"])
        stream = store.split(split)
        _check(f"megatron/{split}", tokens.astype(np.int64), stream.read(0, stream.size))
        if not np.array_equal(np.cumsum(lengths), np.append(stream.doc_starts(), stream.size)[1:]):
            raise VerifyError(f"megatron/{split}: document lengths differ from the token store's boundaries")
        out[split] = {"documents": int(lengths.size), "tokens_checked": int(tokens.size)}
    return out


def check_tokenization(
    store: TokenStore, tokenizer_dir: Path, data_cfg: dict, sources: list[str], sample: int, mix: dict | None = None
) -> dict:
    """Re-tokenize up to `sample` documents per shard with the HF tokenizer; compare with the store."""
    from safetensors import safe_open

    from llmpipe.data.tokenizer import HFEncoder

    hf = HFEncoder(tokenizer_dir, 1)
    bos = store.manifest["tokenizer"]["bos_id"]
    checked = 0
    for shard, entry in enumerate(store.manifest["shards"]):
        plan = assign(sources, data_cfg["num_shards"], shard)
        f = safe_open(str(store.root / entry["file"]), framework="numpy")
        index = {}  # doc id -> (tokens slice of its split, start, end); tokens are read per document
        for split in SPLITS:
            offs, ids, toks = f.get_tensor(f"{split}.offsets"), f.get_tensor(f"{split}.doc_ids"), f.get_slice(f"{split}.tokens")
            index.update({int(d): (toks, int(offs[i]), int(offs[i + 1])) for i, d in enumerate(ids)})
        texts = []
        for s_idx, source in plan.sources:
            for r_idx, text in documents(source, data_cfg, ReadStats(), mixture.keeper(mix, s_idx, plan.keep)):
                texts.append((doc_id(s_idx, r_idx), text))
                if len(texts) >= sample:
                    break
            if len(texts) >= sample:
                break
        for (did, _), ids in zip(texts, hf.encode_batch([t for _, t in texts])):
            toks, a, b = index[did]
            want = ([bos] if bos >= 0 else []) + ids + [store.eos_id]
            if toks[a:b].tolist() != want:
                raise VerifyError(f"document {did:#x} (shard {shard}): stored ids differ from the HF tokenizer's")
            checked += 1
    return {"documents_retokenized": checked}


def verify(
    manifest: str | Path, views: list[Path], tokenizer_dir: Path, sources_json: Path, data_cfg: dict, out: Path, sample: int = 64
) -> dict:
    store = TokenStore(manifest)
    sources = [e["source"] for e in json.loads(Path(sources_json).read_text())["sources"]]
    result = {
        "tokenizer": store.manifest["tokenizer"],
        "sources": json.loads(Path(sources_json).read_text()),
        "documents": {s: store.manifest["totals"][s]["documents"] for s in SPLITS},
        "tokens": {s: store.manifest["totals"][s]["tokens"] for s in SPLITS},
        "read": store.manifest["read"],
        "views": {},
        "files": {},
    }
    result["tokenization"] = check_tokenization(store, tokenizer_dir, data_cfg, sources, sample, mixture.load(sources_json))
    for view in views:
        info = json.loads((view / "view.json").read_text())
        check = {"hf": verify_hf, "litgpt": verify_litgpt, "megatron": verify_megatron}[info["format"]]
        result["views"][info["format"]] = {"conservation": check(store, view, info), **{s: info[s] for s in SPLITS}}
    for root in [store.root, *views]:
        for f in sorted(p for p in root.rglob("*") if p.is_file()):
            result["files"][str(f)] = {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
    write_json(out, result)
    log.info("verified: %s", {k: result[k] for k in ("documents", "tokens", "tokenization")})
    return result


def main(argv: list[str] | None = None) -> None:
    from llmpipe import config as cfgmod

    p = argparse.ArgumentParser(prog="llmpipe verify", description=__doc__)
    p.add_argument("--config", required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--views", nargs="+", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--sources", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--sample", type=int, default=64, help="documents per shard re-tokenized with the HF tokenizer")
    args = p.parse_args(argv)
    verify(
        args.store,
        [Path(v) for v in args.views],
        Path(args.tokenizer),
        Path(args.sources),
        cfgmod.load(args.config)["data"],
        Path(args.out),
        args.sample,
    )
