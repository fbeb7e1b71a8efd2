"""Read documents from one source: a local path or fsspec URL (JSONL[.gz|.zst], Parquet, text) or a
Hugging Face dataset ("hf:<id or local folder>"), under an explicit bad-record policy."""

from __future__ import annotations

import contextlib
import io
import logging
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import fsspec
import orjson

log = logging.getLogger(__name__)

HF_PREFIX = "hf:"
SHOW_LOCATIONS = 5  # offending locations logged per reason under on_bad_record: skip
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
TEXT_SUFFIXES = (".txt",)


class BadRecord(ValueError):
    """A record without usable text; `reason` is the counted category."""

    def __init__(self, reason: str, where: str, detail: str):
        super().__init__(f"{where}: {detail}")
        self.reason, self.where = reason, where


@dataclass
class ReadStats:
    documents: int = 0
    bytes: int = 0  # UTF-8 bytes of the documents kept
    skipped: Counter = field(default_factory=Counter)  # reason -> count
    examples: dict = field(default_factory=dict)  # reason -> first few locations

    def skip(self, err: BadRecord) -> None:
        self.skipped[err.reason] += 1
        shown = self.examples.setdefault(err.reason, [])
        if len(shown) < SHOW_LOCATIONS:
            shown.append(str(err))
            log.warning("skipped (%s) %s", err.reason, err)

    def as_dict(self) -> dict:
        return {
            "documents": self.documents,
            "bytes": self.bytes,
            "skipped": dict(self.skipped),
            "skipped_total": sum(self.skipped.values()),
            "skipped_examples": self.examples,
        }

    def add(self, other: dict) -> None:
        self.documents += other["documents"]
        self.bytes += other["bytes"]
        self.skipped.update(other["skipped"])
        for reason, shown in other["skipped_examples"].items():
            self.examples.setdefault(reason, []).extend(shown[: SHOW_LOCATIONS - len(self.examples.get(reason, []))])


def _compression(url: str) -> str | None:
    return {"gz": "gzip", "zst": "zstd", "bz2": "bz2", "xz": "xz"}.get(url.rsplit(".", 1)[-1].lower())


def _base_name(url: str) -> str:
    name = url.lower()
    return name.rsplit(".", 1)[0] if _compression(url) else name


@contextlib.contextmanager
def _open_binary(url: str) -> Iterator:
    """A line-iterable binary stream of `url`, decompressed by its suffix."""
    comp = _compression(url)
    if comp not in ("zstd", "gzip"):
        with fsspec.open(url, "rb", compression=comp) as fh:
            yield fh
        return
    with fsspec.open(url, "rb") as raw:
        if comp == "gzip":  # ISA-L's gzip reader: same bytes as the gzip module, ~2.5x faster
            from isal import igzip

            with igzip.IGzipFile(fileobj=raw, mode="rb") as fh:
                yield fh
        else:
            import zstandard

            yield io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw))


BOM = b"\xef\xbb\xbf"


def _lines(fh, size: int = 1 << 20) -> Iterator[bytes]:
    """The lines of a binary stream ending in LF, CRLF or CR (universal newlines, as Python's text
    mode and editors count them; JSON never holds a raw CR inside a string), streamed."""
    buf = bytearray()
    while chunk := fh.read(size):
        start = max(len(buf) - 1, 0)  # a held-back CR may pair with an LF at the chunk's start
        buf += chunk
        end = len(buf) - 1 if buf.endswith(b"\r") else len(buf)  # hold back a final CR
        cut = max(buf.rfind(b"\n", start, end), buf.rfind(b"\r", start, end))
        if cut >= 0:
            yield from bytes(buf[: cut + 1]).splitlines(keepends=True)
            del buf[: cut + 1]
    if buf:
        yield from bytes(buf).splitlines(keepends=True)


def _jsonl(url: str, text_field: str, keep=None) -> Iterator[tuple[str, object]]:
    """`keep(record index)` false: the record is not parsed (yields a placeholder the caller drops)."""
    index = 0
    with _open_binary(url) as fh:
        for lineno, raw in enumerate(_lines(fh), 1):
            if lineno == 1 and raw.startswith(BOM):  # a UTF-8 byte order mark (Windows editors)
                raw = raw[len(BOM) :]
            if not raw.strip():
                continue
            index += 1
            if keep is not None and not keep(index - 1):
                yield "", None
                continue
            where = f"{url}:{lineno}"
            try:
                record = orjson.loads(raw)  # validates UTF-8 too
            except orjson.JSONDecodeError as exc:
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as uexc:
                    yield where, BadRecord("invalid_utf8", where, f"invalid UTF-8 at byte {uexc.start}")
                    continue
                yield where, BadRecord("bad_json", where, f"not valid JSON ({exc.msg})")
                continue
            if not isinstance(record, dict) or text_field not in record:
                yield where, BadRecord("missing_field", where, f"no '{text_field}' field")
                continue
            yield where, record[text_field]


def _parquet(url: str, text_field: str) -> Iterator[tuple[str, object]]:
    import pyarrow.parquet as pq

    with fsspec.open(url, "rb") as fh:
        pf = pq.ParquetFile(fh)
        if text_field not in pf.schema_arrow.names:
            raise BadRecord("missing_field", url, f"no '{text_field}' column (columns: {', '.join(pf.schema_arrow.names)})")
        row = 0
        for batch in pf.iter_batches(columns=[text_field], batch_size=256):
            for value in batch.column(0).to_pylist():
                yield f"{url}:row {row}", value
                row += 1


PARAGRAPH_BREAK = re.compile(r"(?:\r\n|\r|\n){2}")  # an empty line, in any newline style


def _text(url: str, mode: str) -> Iterator[tuple[str, object]]:
    with _open_binary(url) as fh:
        raw = fh.read()
    try:
        text = raw.decode("utf-8-sig")  # without a leading byte order mark
    except UnicodeDecodeError as exc:
        yield url, BadRecord("invalid_utf8", url, f"invalid UTF-8 at byte {exc.start}")
        return
    if mode == "file":
        yield url, text
        return
    for i, para in enumerate(PARAGRAPH_BREAK.split(text)):
        if para.strip():
            yield f"{url}:paragraph {i}", para


def _hf(spec: str, cfg: dict) -> Iterator[tuple[str, object]]:
    import datasets

    ds = datasets.load_dataset(
        spec[len(HF_PREFIX) :], cfg["hf_config"], split=cfg["hf_split"], revision=cfg["hf_revision"], streaming=cfg["streaming"]
    )
    for i, record in enumerate(ds):
        where = f"{spec}[{i}]"
        if cfg["text_field"] not in record:
            yield where, BadRecord("missing_field", where, f"no '{cfg['text_field']}' field")
        else:
            yield where, record[cfg["text_field"]]


def records(source: str, cfg: dict, keep=None) -> Iterator[tuple[str, object]]:
    """(location, text or BadRecord) for every record of one source, in order; a record whose index
    `keep` rejects may come as a placeholder, not read."""
    if source.startswith(HF_PREFIX):
        return _hf(source, cfg)
    name = _base_name(source)
    if name.endswith(JSONL_SUFFIXES):
        return _jsonl(source, cfg["text_field"], keep)
    if name.endswith(".parquet"):
        return _parquet(source, cfg["text_field"])
    if name.endswith(TEXT_SUFFIXES):
        return _text(source, cfg["text_mode"])
    raise ValueError(
        f"unsupported data source format: {source} (expected .jsonl/.json[.gz|.zst], .parquet, .txt[.gz|.zst] or hf:<id>)"
    )


def check(where: str, value: object, cfg: dict) -> str | BadRecord:
    """The document text, or why it is not usable."""
    if isinstance(value, BadRecord):
        return value
    if not isinstance(value, str):
        return BadRecord("not_string", where, f"text is {type(value).__name__}, not a string")
    if "\x00" in value:
        return BadRecord("nul_bytes", where, "text contains NUL bytes")
    if not value.strip():
        return BadRecord("empty", where, "empty document")
    limit = cfg["max_document_chars"]
    if limit is not None and len(value) > limit:
        return BadRecord("too_long", where, f"document of {len(value)} characters exceeds data.max_document_chars {limit}")
    return value


def documents(source: str, cfg: dict, stats: ReadStats, keep=lambda index: True) -> Iterator[tuple[int, str]]:
    """(record index, text) of the usable documents of `source` whose index `keep` accepts.

    Bad records stop the run (on_bad_record: fail) or are counted by reason (skip); empty
    documents are always counted and skipped. Record indices count every record, so they
    do not move when the policy changes.
    """
    limit = cfg["max_records_per_source"]
    for index, (where, value) in enumerate(records(source, cfg, keep)):
        if limit is not None and index >= limit:
            return
        if not keep(index):
            continue
        result = check(where, value, cfg)
        if isinstance(result, BadRecord):
            if cfg["on_bad_record"] == "fail" and result.reason != "empty":
                raise result
            stats.skip(result)
            continue
        stats.documents += 1
        stats.bytes += len(result.encode("utf-8", "surrogatepass"))
        yield index, result


def iter_documents(cfg: dict, stats: ReadStats | None = None) -> Iterator[str]:
    """Every usable document of every source (data section `cfg`), in order."""
    from llmpipe.data.mixture import paths
    from llmpipe.data.sources import expand_sources

    stats = stats if stats is not None else ReadStats()
    for source in expand_sources(paths(cfg["sources"])):
        for _, text in documents(source, cfg, stats):
            yield text
