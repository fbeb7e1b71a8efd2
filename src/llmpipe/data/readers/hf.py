"""Hugging Face datasets (hf:<id or folder>): streamed from the Hub or a save_to_disk / parquet folder."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator

from llmpipe.data.readers.parquet import _MISSING, InvalidUtf8, _arrow_values, _parquet_file, _parquet_values
from llmpipe.data.readers.stats import BadRecord
from llmpipe.data.sources import HF_PREFIX


class _At(tuple):
    """(where, value) of a record read with its own place: a line of a local JSON Lines data file."""


def _hf(spec: str, cfg: dict) -> Iterator[tuple[str, object]]:
    field = cfg["text_field"]
    for i, value in enumerate(_hf_values(spec[len(HF_PREFIX) :], cfg)):
        if isinstance(value, _At):
            yield value
            continue
        where = f"{spec}[{i}]"
        if value is _MISSING:
            value = BadRecord("missing_field", where, f"no '{field}' field")
        yield where, value.bad(where) if isinstance(value, InvalidUtf8) else value


def _hf_values(path: str, cfg: dict) -> Iterator[object]:
    """The text field's value (or _MISSING) of each record of a Hugging Face dataset, in order. Read here, in
    bounded memory: a local save_to_disk folder (_saved_values) and, when streaming, local Parquet data files
    (page by page; datasets' own streaming decodes a whole row group at once). The rest through datasets:
    its streaming, or (streaming false) its Arrow cache, memory-mapped. Local JSON Lines data files, when
    streaming, go through our JSONL reader (a bad line is one counted record at its file:line; datasets
    would drop its whole 10 MB block and name the source unreadable)."""
    import os

    if os.path.isfile(os.path.join(path, "state.json")) or os.path.isfile(os.path.join(path, "dataset_dict.json")):
        yield from _saved_values(path, cfg)
        return
    import datasets

    field, split = cfg["text_field"], cfg["hf_split"]
    if not cfg["streaming"]:
        ds = datasets.load_dataset(path, cfg["hf_config"], split=split, revision=cfg["hf_revision"])
    else:
        builder = datasets.load_dataset_builder(path, cfg["hf_config"], revision=cfg["hf_revision"])
        files = {str(name): list(found) for name, found in (builder.config.data_files or {}).items()}
        if _local_parquet(builder, files.get(split)):
            for file in files[split]:
                with open(file, "rb") as fh:
                    pf = _parquet_file(fh)
                    if field in pf.schema_arrow.names:
                        yield from _parquet_values(pf, field)
                    else:
                        yield from itertools.repeat(_MISSING, pf.metadata.num_rows)
            return
        if _local_jsonl(builder, files.get(split)):
            from llmpipe.data.readers.jsonl import _jsonl

            for file in files[split]:
                yield from (_At(item) for item in _jsonl(file, field))
            return
        ds = builder.as_streaming_dataset(split=split)
    for record in ds:
        yield record[field] if field in record else _MISSING


def _local_parquet(builder, files: list | None) -> bool:
    """datasets would stream these local Parquet files as they are (no filter, column choice or features)."""
    conf = builder.config
    plain = getattr(conf, "filters", None) is None and getattr(conf, "columns", None) is None and conf.features is None
    return builder.name == "parquet" and plain and bool(files) and not any("://" in str(f) for f in files)


def _local_jsonl(builder, files: list | None) -> bool:
    """datasets would stream these local JSON Lines files as they are (one object per line; .json files may
    hold one array, which datasets reads and our reader does not)."""
    conf = builder.config
    plain = getattr(conf, "field", None) is None and conf.features is None
    lines = (".jsonl", ".ndjson", ".jsonl.gz", ".jsonl.zst", ".ndjson.gz")
    return (
        builder.name == "json"
        and plain
        and bool(files)
        and all("://" not in str(f) and str(f).lower().endswith(lines) for f in files)
    )


def _saved_values(path: str, cfg: dict) -> Iterator[object]:
    """A folder written by datasets' save_to_disk (a Dataset; or a DatasetDict: its `hf_split`), read file by
    file, record batch by record batch, as load_from_disk orders it (which would memory-map the files)."""
    import os

    import pyarrow as pa

    if os.path.isfile(os.path.join(path, "dataset_dict.json")):
        with open(os.path.join(path, "dataset_dict.json")) as fh:
            splits = json.load(fh)["splits"]
        if cfg["hf_split"] not in splits:
            raise ValueError(f"hf:{path}: no split {cfg['hf_split']!r} (data.hf_split; splits: {', '.join(splits)})")
        path = os.path.join(path, cfg["hf_split"])
    with open(os.path.join(path, "state.json")) as fh:
        names = [entry["filename"] for entry in json.load(fh)["_data_files"]]
    field = cfg["text_field"]
    for name in names:  # Arrow's own file: each batch's body in Arrow's pool, not a new bytes object per batch
        # (through a Python file the peak settled a batch or two higher: 79 -> 87 MiB from 30 to 300 MB)
        with pa.OSFile(os.path.join(path, name)) as fh:
            yield from _arrow_values(pa.ipc.open_stream(fh), field)
