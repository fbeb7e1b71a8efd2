"""Token estimate before any data stage ran: corpus text bytes x tokens per byte of the run's tokenizer.

Text bytes: up to MAX_SAMPLED sources (evenly spread) are read from their start (SAMPLE_BYTES of
file, decompressed as far as it goes); a source read whole counts exactly, otherwise its size x the
sample's text bytes per file byte; unsampled sources use the ratio of sampled ones of the same
format. Tokens per byte: the tokenizer (tokenizer.source, or this run's tokenizer/ if built, else a
BPE trained here the way the tokenizer rule trains it, on the sample) on the sampled documents.
Then x (1 - val_fraction) for train, + EOS (and BOS where added) per document.
"""

from __future__ import annotations

import bz2
import lzma
import tempfile
import zlib
from pathlib import Path

import fsspec
import orjson
from tqdm import tqdm

from llmpipe.data.readers import HF_PREFIX
from llmpipe.data.sources import expand_sources, is_validation

SAMPLE_BYTES = 4 << 20  # file bytes read per sampled source
MAX_SAMPLED = 8
MAX_TOKENIZED_BYTES = 16 << 20  # text the tokenizer measures (all sources together)
COMPRESSION = {"gz": "gzip", "zst": "zstd", "bz2": "bz2", "xz": "xz"}


def _kind(source: str) -> tuple[str, str | None]:
    name = source.lower()
    comp = COMPRESSION.get(name.rsplit(".", 1)[-1])
    if comp:
        name = name.rsplit(".", 1)[0]
    for kind in ("jsonl", "json", "ndjson", "parquet", "txt"):
        if name.endswith("." + kind):
            return ("jsonl" if kind in ("json", "ndjson") else kind), comp
    raise ValueError(f"cannot estimate tokens of {source}: unknown format")


def _decompress(raw: bytes, comp: str | None) -> bytes:
    """As much of a (possibly truncated) compressed prefix as decodes."""
    if comp is None:
        return raw
    if comp == "zstd":
        from llmpipe.data.readers.opener import zstd_module

        return zstd_module().ZstdDecompressor().decompress(raw)
    if comp == "gzip":
        out = []
        while raw:  # concatenated gzip members
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out.append(d.decompress(raw))
            raw = d.unused_data
        return b"".join(out)
    return (bz2.BZ2Decompressor() if comp == "bz2" else lzma.LZMADecompressor()).decompress(raw)


def _texts(data: bytes, whole: bool, kind: str, d: dict) -> list[tuple[int, str]]:
    """(record index as the readers count it, text) of the usable documents in a decoded prefix."""
    if kind == "txt":
        text = data.decode("utf-8", "ignore")
        if d["text_mode"] == "file":
            return [(0, text)] if text.strip() else []
        paras = [p for p in text.split("\n\n") if p.strip()]
        return list(enumerate(paras if whole else paras[:-1]))
    lines = [line for line in data.split(b"\n") if line.strip()]
    texts = []
    for index, line in enumerate(lines if whole else lines[:-1]):  # the last line of a prefix may be cut
        try:
            value = orjson.loads(line).get(d["text_field"])
        except (orjson.JSONDecodeError, AttributeError):
            continue
        if isinstance(value, str) and value.strip():
            texts.append((index, value))
    return texts


def sample_source(index: int, source: str, d: dict) -> dict:
    """Documents from the start of one source (number `index`), its estimated text bytes and documents,
    and the share of them (by bytes) the validation split takes."""
    kind, comp = _kind(source)
    fs, path = fsspec.core.url_to_fs(source)
    size = fs.info(path)["size"]
    limit = d["max_records_per_source"]
    if kind == "parquet":
        import pyarrow.parquet as pq

        with fs.open(path, "rb") as fh:
            pf = pq.ParquetFile(fh)
            rows = pf.metadata.num_rows
            texts, seen, chars = [], 0, 0
            for batch in pf.iter_batches(columns=[d["text_field"]], batch_size=256):
                values = batch.column(0).to_pylist()
                texts += [(seen + i, t) for i, t in enumerate(values) if isinstance(t, str) and t.strip()]
                seen += len(values)
                chars += sum(len(t) for t in values if isinstance(t, str))
                if chars >= SAMPLE_BYTES or (limit and seen >= limit):
                    break
        whole = seen >= rows
        docs = rows
    else:
        with fs.open(path, "rb") as fh:
            raw = fh.read(SAMPLE_BYTES)
        whole = len(raw) >= size
        texts = _texts(_decompress(raw, comp), whole, kind, d)
        docs = None
    if limit is not None and texts and texts[-1][0] >= limit - 1:
        texts, whole = [t for t in texts if t[0] < limit], True
    if not texts:
        raise ValueError(f"cannot estimate tokens of {source}: no documents with '{d['text_field']}' text in its first bytes")
    sizes = [len(t.encode("utf-8", "surrogatepass")) for _, t in texts]
    text_bytes = sum(sizes)
    val_bytes = sum(n for (r, _), n in zip(texts, sizes) if is_validation(index, r, d["val_fraction"], d["split_seed"]))
    if whole:
        est_bytes, est_docs = text_bytes, len(texts)
    elif kind == "parquet":
        est_bytes, est_docs = text_bytes / len(texts) * docs, docs
    else:
        est_bytes = size * text_bytes / len(raw)
        est_docs = est_bytes / (text_bytes / len(texts))
    return {
        "source": source,
        "kind": kind,
        "size": size,
        "read_whole": whole,
        "texts": [t for _, t in texts],
        "text_bytes": est_bytes,
        "documents": est_docs,
        "val_share": val_bytes / text_bytes,
    }


def _spread(n: int, k: int) -> list[int]:
    return sorted({round(i * (n - 1) / max(1, k - 1)) for i in range(min(n, k))})


def _train_sample_tokenizer(cfg: dict, sampled: list[dict], out: Path) -> None:
    """A BPE trained like the tokenizer rule trains it, on the sampled documents only."""
    from llmpipe.data.tokenizer import train_tokenizer

    d = {**cfg["data"], "max_records_per_source": max(len(s["texts"]) for s in sampled)}
    t = cfg["tokenizer"]
    train_tokenizer(d, [s["source"] for s in sampled], out, t["vocab_size"], t["min_frequency"], t["max_train_documents"])


def _tokens_per_byte(tok_dir: Path, texts: list[str]) -> tuple[float, int]:
    from llmpipe.data.tokenizer import load_backend

    tok = load_backend(tok_dir)
    n_bytes = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    n_tokens = sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
    return n_tokens / n_bytes, n_bytes


def estimate(cfg: dict, tokenizer_dir: Path | None) -> dict:
    d = cfg["data"]
    from llmpipe.data.mixture import paths  # weighted sources: their paths (the estimate ignores weights)

    hf = [s for s in paths(d["sources"]) if s.startswith(HF_PREFIX)]
    if hf:
        raise ValueError(
            f"cannot estimate tokens of {', '.join(hf)} before the data stages run: build the token store "
            "first (snakemake <results>/<run>/data/tokens/manifest.json) and plan again"
        )
    sources = expand_sources(paths(d["sources"]))
    picks = _spread(len(sources), MAX_SAMPLED)
    sampled = [sample_source(i, sources[i], d) for i in tqdm(picks, desc="plan: sampling sources", unit=" source")]
    fs_sizes = {}
    for i, src in enumerate(sources):
        if i not in picks:
            fs, path = fsspec.core.url_to_fs(src)
            fs_sizes[i] = fs.info(path)["size"]
    ratio = {}  # text bytes per file byte, by format
    for s in sampled:
        r = ratio.setdefault(s["kind"], [0.0, 0, 0.0])
        r[0] += s["text_bytes"]
        r[1] += s["size"]
        r[2] += s["documents"]
    text_bytes = sum(s["text_bytes"] for s in sampled)
    documents = sum(s["documents"] for s in sampled)
    all_bytes, all_size, all_docs = (sum(r[j] for r in ratio.values()) for j in range(3))
    for i, size in fs_sizes.items():
        kb, ks, kd = ratio.get(_kind(sources[i])[0], (all_bytes, all_size, all_docs))
        text_bytes += size * kb / ks
        documents += size * kd / ks

    texts, budget = [], MAX_TOKENIZED_BYTES
    for s in sampled:
        for t in s["texts"]:
            if budget <= 0:
                break
            texts.append(t)
            budget -= len(t)
    with tempfile.TemporaryDirectory() as tmp:
        if tokenizer_dir is None:
            tokenizer_dir, how = Path(tmp) / "tok", "BPE trained on the sample (the tokenizer rule has not run)"
            _train_sample_tokenizer(cfg, sampled, tokenizer_dir)
        else:
            how = str(tokenizer_dir)
        per_byte, measured = _tokens_per_byte(tokenizer_dir, texts)
        from llmpipe.data.tokenizer import tokenizer_info

        adds_bos = tokenizer_info(tokenizer_dir).adds_bos
    specials = 1 + (d["add_bos"] == "always" or (d["add_bos"] == "auto" and adds_bos))  # EOS (+ BOS) per document
    # sources read whole split exactly as the data stages will; elsewhere the sample's share stands in
    val_share = sum(s["val_share"] * s["text_bytes"] for s in sampled) / sum(s["text_bytes"] for s in sampled)
    train_share = 1 - val_share
    return {
        "sources": len(sources),
        "sampled_sources": len(sampled),
        "read_whole": all(s["read_whole"] for s in sampled),
        "text_bytes": round(text_bytes),
        "documents": round(documents),
        "tokenizer": how,
        "measured_bytes": measured,
        "bytes_per_token": 1 / per_byte,
        "train_tokens": round(train_share * (text_bytes * per_byte + documents * specials)),
        "val_tokens": round((1 - train_share) * (text_bytes * per_byte + documents * specials)),
        "val_share": val_share,
    }
