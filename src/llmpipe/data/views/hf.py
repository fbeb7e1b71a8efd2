"""HF view: datasets.save_to_disk folders train/ and val/ with `input_ids`, `attention_mask`,
`labels` (and `segment_ids` unless disabled), each exactly seq_len long. Loads with
load_from_disk + transformers.default_data_collator into int64 [B, seq_len] (NxD's contract).

The files are written with pyarrow in the layout datasets' ArrowWriter writes (the same schema and
metadata; tests/test_data_perf.py compares them with an ArrowWriter fed the same 256-row batches, and
load_from_disk reads them): importing datasets costs more
than writing a view of 100 MB of text."""

from __future__ import annotations

import hashlib
import json
import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from llmpipe.data.pack import IGNORE_INDEX, Layout, order, rows
from llmpipe.data.token_store import TokenStore
from llmpipe.io import WriteOnce

log = logging.getLogger(__name__)
ROWS_PER_BATCH = 256
AHEAD = 2  # batches made at once, ahead of the writer (one file)
WRITERS = 2  # files written at once, each one batch ahead (numpy and the writes free the GIL)
WRITER_BATCH_SIZE = 1000  # datasets.config.DEFAULT_MAX_BATCH_SIZE, ArrowWriter's record batch limit
MAX_FILE_BYTES = 500 * 10**6  # datasets.config.MAX_SHARD_SIZE ("500MB"), save_to_disk's bound on a file's data


def data_files(rows: int, row_bytes: int) -> list[tuple[str, range]]:
    """The files save_to_disk writes for `rows` rows of `row_bytes` bytes (int(bytes / MAX_FILE_BYTES) + 1,
    at most one a row), each with its rows, cut as Dataset.shard(contiguous=True) cuts them."""
    n = max(1, min(int(rows * row_bytes / MAX_FILE_BYTES) + 1, rows))
    div, mod = divmod(rows, n)
    out, a = [], 0
    for i in range(n):
        b = a + div + (1 if i < mod else 0)
        out.append((f"data-{i:05d}-of-{n:05d}.arrow", range(a, b)))
        a = b
    return out


def row_bytes(cols: dict[str, str], seq_len: int) -> int:
    return seq_len * sum(np.dtype(v).itemsize for v in cols.values())


def _column(batch: np.ndarray, dtype, length: int) -> pa.Array:
    """[n, length] -> fixed-size lists (no copy when `batch` already has `dtype`; from_buffers, as
    pa.array() would import pandas, 0.2 s)."""
    flat = np.ascontiguousarray(batch, dtype).reshape(-1)
    values = pa.Array.from_buffers(pa.from_numpy_dtype(flat.dtype), flat.size, [None, pa.py_buffer(flat)])
    return pa.FixedSizeListArray.from_arrays(values, length)


def _columns(segment_ids: bool, seg_dtype: str) -> dict[str, str]:
    cols = {"input_ids": "int32", "attention_mask": "int8", "labels": "int32"}
    if segment_ids:
        cols["segment_ids"] = seg_dtype
    return cols


# The feature type as datasets < 4 names it: NxD's trainers pin datasets<=3.6.0 (envs/neuron.txt), which
# knows no "List" (datasets 4 added it, and still reads "Sequence" with a length as List(length=)).
SEQUENCE = "Sequence"


def _schema(cols: dict[str, str], seq_len: int) -> pa.Schema:
    """Features({k: Sequence(Value(v), length=seq_len)}).arrow_schema with the metadata ArrowWriter adds."""
    features = {k: {"feature": {"dtype": v, "_type": "Value"}, "length": seq_len, "_type": SEQUENCE} for k, v in cols.items()}
    return pa.schema(
        [pa.field(k, pa.list_(pa.from_numpy_dtype(np.dtype(v)), seq_len)) for k, v in cols.items()],
        metadata={"huggingface": json.dumps({"info": {"features": features}})},
    )


def _finish(folder: Path, data_files: list[str], fingerprint: str, cols: dict[str, str], seq_len: int) -> None:
    """state.json + dataset_info.json exactly as Dataset.save_to_disk writes them (dataset_info: the
    DatasetInfo that datasets reads back from the file's schema, every other field at its default).
    The fingerprint derives from what made the rows (not random), so a rebuild is byte-identical."""
    state = {
        "_fingerprint": fingerprint[:16],
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
        "_data_files": [{"filename": name} for name in data_files],
    }
    (folder / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
    features = {
        k: {"feature": {"dtype": v, "id": None, "_type": "Value"}, "length": seq_len, "id": None, "_type": SEQUENCE}
        for k, v in cols.items()
    }
    info = dict.fromkeys(
        (
            "builder_name",
            "config_name",
            "dataset_name",
            "dataset_size",
            "download_checksums",
            "download_size",
            "post_processed",
            "post_processing_size",
            "size_in_bytes",
            "splits",
            "supervised_keys",
            "version",
        )
    )
    info.update(citation="", description="", homepage="", license="", features=features)
    (folder / "dataset_info.json").write_text(json.dumps({k: info[k] for k in sorted(info)}, indent=2))


def write_split(
    store: TokenStore, split: str, out: Path, seq_len: int, remainder: str, shuffle: bool, seed: int, segment_ids: bool
) -> dict:
    stream = store.split(split)
    layout = Layout(stream.size, seq_len, remainder)
    if layout.rows == 0:
        raise ValueError(f"{split} split has {stream.size} tokens: not one row of seq_len {seq_len}")
    starts = stream.lazy_doc_starts() if segment_ids else None
    seg_dtype = "int16" if seq_len < 2**15 else "int32"
    cols_spec = _columns(segment_ids, seg_dtype)
    schema = _schema(cols_spec, seq_len)
    perm = order(layout.rows, shuffle, seed)
    out.mkdir(parents=True)
    files = data_files(layout.rows, row_bytes(cols_spec, seq_len))

    def batch(k: int, stop: int) -> pa.RecordBatch:
        ids, mask, segs = rows(
            stream.view,
            layout,
            perm[k : min(k + ROWS_PER_BATCH, stop)],
            store.eos_id,
            starts,
            np.int32,
            seg_dtype,
            gather=stream.full_rows,
        )
        labels = ids if mask.all() else np.where(mask == 1, ids, np.int32(IGNORE_INDEX))
        cols = [_column(ids, np.int32, seq_len), _column(mask, np.int8, seq_len), _column(labels, np.int32, seq_len)]
        if segment_ids:
            cols.append(_column(segs, seg_dtype, seq_len))
        return pa.record_batch(cols, schema=schema)

    def write_file(name: str, part: range, ahead: int) -> None:
        starts_at = range(part.start, part.stop, ROWS_PER_BATCH)
        with WriteOnce(out / name) as fh, pa.ipc.new_stream(fh, schema) as writer, ThreadPoolExecutor(ahead) as pool:
            # the next `ahead` batches are made while this one is written
            pending = deque(pool.submit(batch, k, part.stop) for k in starts_at[:ahead])
            for i in range(len(starts_at)):
                done = pending.popleft().result()
                if i + ahead < len(starts_at):
                    pending.append(pool.submit(batch, starts_at[i + ahead], part.stop))
                writer.write_table(pa.Table.from_batches([done]), WRITER_BATCH_SIZE)
                progress.update(1)

    total = sum(-(-len(part) // ROWS_PER_BATCH) for _, part in files)
    with tqdm(total=total, desc=f"pack hf/{split}", unit=" batches", mininterval=10) as progress:
        if len(files) == 1:
            write_file(*files[0], AHEAD)
        else:  # several files (a view over MAX_FILE_BYTES): WRITERS at once
            with ThreadPoolExecutor(WRITERS) as pool:
                for done in [pool.submit(write_file, name, part, 1) for name, part in files]:
                    done.result()
    made_by = {
        "store": store.manifest["fingerprint"],
        "split": split,
        "seq_len": seq_len,
        "remainder": remainder,
        "shuffle": shuffle,
        "seed": seed,
        "segment_ids": segment_ids,
    }
    _finish(
        out,
        [name for name, _ in files],
        hashlib.sha256(json.dumps(made_by, sort_keys=True).encode()).hexdigest(),
        cols_spec,
        seq_len,
    )
    return {**layout.stats(), "shuffle": shuffle, "seed": seed, "segment_ids": segment_ids}


def write(store: TokenStore, out: Path, cfg: dict) -> dict:
    d, seq_len = cfg["data"], cfg["train"]["seq_len"]
    stats = {}
    for split, policy, shuffle in (("train", d["remainder"], d["shuffle"]), ("val", d["val_remainder"], False)):
        stats[split] = write_split(store, split, out / split, seq_len, policy, shuffle, d["shuffle_seed"], d["segment_ids"])
    return stats
