"""Read documents from local files (JSONL[.gz|.zst], Parquet, text) or a Hugging Face dataset."""

from __future__ import annotations

import glob
import gzip
import io
import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

log = logging.getLogger(__name__)

HF_PREFIX = "hf:"


class BadRecord(ValueError):
    """A record has no usable text."""


@dataclass
class ReadStats:
    documents: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> count

    def as_dict(self) -> dict:
        return {"documents": self.documents, "skipped": dict(self.skipped), "skipped_total": sum(self.skipped.values())}


def expand_sources(sources: list[str]) -> list[str]:
    """Expand globs (sorted, deterministic); HF ids pass through. A pattern matching nothing is an error."""
    out: list[str] = []
    for src in sources:
        if src.startswith(HF_PREFIX):
            out.append(src)
            continue
        matches = sorted(glob.glob(src)) if glob.has_magic(src) else ([src] if Path(src).exists() else [])
        if not matches:
            raise FileNotFoundError(f"data source not found: {src}")
        out.extend(matches)
    return out


def _open_text(path: str):
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    if path.endswith(".zst"):
        import zstandard

        return io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(open(path, "rb")), encoding="utf-8")
    return open(path, encoding="utf-8")


def _records_jsonl(path: str, text_field: str) -> Iterator[tuple[str, object]]:
    with _open_text(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                yield where, BadRecord(f"{where}: not valid JSON ({exc.msg})")
                continue
            if not isinstance(record, dict) or text_field not in record:
                yield where, BadRecord(f"{where}: no '{text_field}' field")
                continue
            yield where, record[text_field]


def _records_parquet(path: str, text_field: str) -> Iterator[tuple[str, object]]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    if text_field not in pf.schema_arrow.names:
        raise BadRecord(f"{path}: no '{text_field}' column (columns: {', '.join(pf.schema_arrow.names)})")
    row = 0
    for batch in pf.iter_batches(columns=[text_field], batch_size=4096):
        for value in batch.column(0).to_pylist():
            yield f"{path}:row {row}", value
            row += 1


def _records_text(path: str, mode: str) -> Iterator[tuple[str, object]]:
    with _open_text(path) as fh:
        text = fh.read()
    if mode == "file":
        yield path, text
        return
    for i, para in enumerate(p for p in text.split("\n\n")):
        if para.strip():
            yield f"{path}:paragraph {i}", para


def _records_hf(spec: str, cfg: dict) -> Iterator[tuple[str, object]]:
    import datasets

    ds = datasets.load_dataset(
        spec[len(HF_PREFIX):],
        cfg["hf_config"],
        split=cfg["hf_split"],
        revision=cfg["hf_revision"],
        streaming=cfg["streaming"],
    )
    for i, record in enumerate(ds):
        where = f"{spec}[{i}]"
        if cfg["text_field"] not in record:
            yield where, BadRecord(f"{where}: no '{cfg['text_field']}' field")
        else:
            yield where, record[cfg["text_field"]]


def _records(source: str, cfg: dict) -> Iterator[tuple[str, object]]:
    name = source.lower()
    if source.startswith(HF_PREFIX):
        return _records_hf(source, cfg)
    if name.endswith((".jsonl", ".jsonl.gz", ".jsonl.zst", ".json", ".json.gz", ".json.zst")):
        return _records_jsonl(source, cfg["text_field"])
    if name.endswith(".parquet"):
        return _records_parquet(source, cfg["text_field"])
    if name.endswith((".txt", ".txt.gz", ".txt.zst")):
        return _records_text(source, cfg["text_mode"])
    raise ValueError(f"unsupported data source format: {source} (expected .jsonl[.gz|.zst], .parquet, .txt or hf:<id>)")


def iter_documents(cfg: dict, stats: ReadStats | None = None) -> Iterator[str]:
    """Yield document texts in a deterministic order, applying the bad-record policy of `cfg` (data section)."""
    stats = stats if stats is not None else ReadStats()
    limit = cfg["max_documents"]
    for source in expand_sources(cfg["sources"]):
        for where, value in _records(source, cfg):
            if limit is not None and stats.documents >= limit:
                return
            if isinstance(value, BadRecord) or not isinstance(value, str):
                err = value if isinstance(value, BadRecord) else BadRecord(f"{where}: text is {type(value).__name__}, not a string")
                if cfg["on_bad_record"] == "error":
                    raise err
                stats.skipped["bad_record"] += 1
                log.warning("skipped %s", err)
                continue
            if not value.strip():
                stats.skipped["empty"] += 1
                continue
            stats.documents += 1
            yield value
