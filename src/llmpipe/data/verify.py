"""verify: re-read the token store and every view, exactly and streaming, and write the run's data
stats (counts, skips, sha256 of every file).

- Token store: each shard's `<split>.tokens` bytes are hashed and compared with the sha256 that
  tokenize recorded (shard metadata and manifest), document offsets are checked against the tokens
  (EOS closes every document, BOS opens it when the policy adds one), the manifest's counts and
  fingerprint are recomputed; a changed token is located by re-tokenizing the shard's documents.
  A sample of documents per shard is re-tokenized with the HF tokenizer.
- Views: every value a trainer reads (hf: input_ids, attention_mask, labels, segment_ids, and the
  dataset's state.json / dataset_info.json; litgpt: every token of every file, padding included;
  megatron: tokens, lengths, byte offsets, document index) is compared with what the pack layout
  (pack.Layout, pack.order) makes of the store, under every remainder policy. A difference names the
  file and the row / token position.

Memory stays flat as the corpus grows: files are read in bounded chunks with plain reads (no memory
map keeps pages resident); what is held whole is O(rows + documents): the row order and document starts.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

import numpy as np

from llmpipe.data import mixture, stfile
from llmpipe.data.get_data import load_sources
from llmpipe.data.pack import IGNORE_INDEX, Layout, order
from llmpipe.data.readers import ReadStats, documents
from llmpipe.data.sources import assign, doc_id
from llmpipe.data.token_store import SPLITS, TokenStore, fingerprint_part
from llmpipe.io import sha256_file, write_json

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20  # bytes read per step (store tokens, megatron files)
ROWS_PER_STEP = 256  # rows compared per step (litgpt; hf goes by the file's record batches)
ST_DTYPES = {"U16": "<u2", "U32": "<u4", "I64": "<i8", "I32": "<i4"}


class VerifyError(AssertionError):
    pass


@contextlib.contextmanager
def _labelled(label: str):
    """Prefix a failure with the view and split it was found in (e.g. `hf/val: <file>: row 3 ...`)."""
    try:
        yield
    except VerifyError as e:
        msg = str(e)
        raise VerifyError(msg if msg.startswith(f"{label}:") else f"{label}: {msg}") from None


def _pread(fd: int, n: int, at: int, what: str) -> bytes:
    raw = os.pread(fd, n, at)
    if len(raw) != n:
        raise VerifyError(f"{what}: file ends early ({len(raw)} of {n} bytes at byte {at})")
    return raw


def _first_diff(got: np.ndarray, want: np.ndarray) -> tuple[int, ...]:
    """Index of the first differing element (arrays of one shape)."""
    return tuple(int(x) for x in np.argwhere(got != want)[0])


# ---------------------------------------------------------------- token store


def _st_header(path: Path) -> tuple[dict, int]:
    """(safetensors header, byte where the tensor data starts)."""
    try:
        return stfile.header(path)
    except ValueError as exc:
        raise VerifyError(str(exc)) from None


class _Shard:
    """One store shard's tensors, read with pread."""

    def __init__(self, path: Path):
        self.path = path
        self.header, self.base = _st_header(path)
        self.meta = self.header.get("__metadata__", {})
        self.fd = os.open(path, os.O_RDONLY)

    def close(self) -> None:
        os.close(self.fd)

    def info(self, name: str) -> tuple[np.dtype, int, int]:
        """(dtype, elements, byte offset in the file)."""
        t = self.header.get(name)
        if t is None or t.get("dtype") not in ST_DTYPES:
            raise VerifyError(f"{self.path}: tensor {name} missing or of an unexpected type")
        dtype = np.dtype(ST_DTYPES[t["dtype"]])
        a, b = t["data_offsets"]
        if (b - a) != dtype.itemsize * int(np.prod(t["shape"])) or len(t["shape"]) != 1:
            raise VerifyError(f"{self.path}: tensor {name} header is inconsistent")
        return dtype, int(t["shape"][0]), self.base + a

    def tensor(self, name: str) -> np.ndarray:
        dtype, n, at = self.info(name)
        return np.frombuffer(_pread(self.fd, n * dtype.itemsize, at, f"{self.path} {name}"), dtype)

    def read(self, name: str, a: int, b: int) -> np.ndarray:
        dtype, n, at = self.info(name)
        return np.frombuffer(_pread(self.fd, (b - a) * dtype.itemsize, at + a * dtype.itemsize, f"{self.path} {name}"), dtype)


class _Stream:
    """One split's token stream over every shard (manifest order), read with pread: a verified
    stand-in for TokenStore.split that leaves no memory-mapped pages behind."""

    def __init__(self, store: TokenStore, split: str):
        self.split = split
        self.shards = [_Shard(store.root / e["file"]) for e in store.manifest["shards"]]
        sizes = [s.info(f"{split}.tokens")[1] for s in self.shards]
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.size = int(self.starts[-1])

    def close(self) -> None:
        for s in self.shards:
            s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def read(self, a: int, b: int) -> np.ndarray:
        if not 0 <= a <= b <= self.size:
            raise IndexError(f"[{a}, {b}) outside the {self.split} stream of {self.size} tokens")
        parts, i = [], int(np.searchsorted(self.starts, a, side="right") - 1)
        while a < b:
            lo, hi = a - int(self.starts[i]), min(b, int(self.starts[i + 1])) - int(self.starts[i])
            if hi > lo:
                parts.append(self.shards[i].read(f"{self.split}.tokens", lo, hi).astype(np.int64))
            a = int(self.starts[i]) + hi
            i += 1
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def doc_starts(self) -> np.ndarray:
        parts = [s.tensor(f"{self.split}.offsets")[:-1] + base for s, base in zip(self.shards, self.starts)]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def check_store(store: TokenStore, locate=None) -> dict:
    """Every shard against its recorded sha256, counts and tokenizer; the manifest against its shards.
    `locate(shard, split, shard_file)`: on a hash mismatch, (token index, document id, index in the
    document, stored, expected) of the first changed token, or None."""
    from llmpipe.data.tokenize import token_dtype

    m = store.manifest
    tok = m["tokenizer"]
    eos, bos = int(tok["eos_id"]), int(tok["bos_id"])
    want_dtype = token_dtype(int(tok["vocab_size"])).newbyteorder("<")
    digest = hashlib.sha256((m.get("sources_key") or "").encode())
    totals = {s: {"documents": 0, "tokens": 0} for s in SPLITS}
    hashed = 0
    for k, entry in enumerate(m["shards"]):
        shard = _Shard(store.root / entry["file"])
        where = str(shard.path)
        try:
            meta = shard.meta
            recorded = {
                "tokenizer_sha256": tok["sha256"],
                "eos_id": str(eos),
                "bos_id": str(bos),
                "vocab_size": str(tok["vocab_size"]),
                "key": m["key"],
                "encoder": entry["encoder"],
            }
            for key, value in recorded.items():
                if meta.get(key) != value:
                    raise VerifyError(f"{where}: metadata {key} is {meta.get(key)!r}, the manifest says {value!r}")
            counts = json.loads(meta.get("counts", "{}"))
            if counts != entry["counts"]:
                raise VerifyError(f"{where}: counts {counts} differ from the manifest's {entry['counts']}")
            for split in SPLITS:
                name = f"{split}.tokens"
                dtype, n, at = shard.info(name)
                if dtype != want_dtype:
                    raise VerifyError(f"{where} {name}: dtype {dtype}, the vocabulary needs {want_dtype}")
                offsets, ids = shard.tensor(f"{split}.offsets"), shard.tensor(f"{split}.doc_ids")
                docs = counts[split]["documents"]
                if n != counts[split]["tokens"] or offsets.size != docs + 1 or ids.size != docs:
                    raise VerifyError(f"{where} {split}: tensor sizes differ from the recorded counts {counts[split]}")
                if offsets[0] != 0 or offsets[-1] != n or (np.diff(offsets) < 1).any():
                    raise VerifyError(f"{where} {split}.offsets: not increasing from 0 to {n}")
                h, step = hashlib.sha256(), max(1, CHUNK_BYTES // dtype.itemsize)
                ends, starts = offsets[1:] - 1, offsets[:-1]
                for a in range(0, n, step):
                    b = min(n, a + step)
                    raw = _pread(shard.fd, (b - a) * dtype.itemsize, at + a * dtype.itemsize, f"{where} {name}")
                    h.update(raw)
                    chunk = np.frombuffer(raw, dtype)
                    for marks, token, what in ((ends, eos, "EOS"), (starts if bos >= 0 else ends[:0], bos, "BOS")):
                        sel = marks[np.searchsorted(marks, a) : np.searchsorted(marks, b)]  # increasing
                        bad = sel[chunk[sel - a] != token]
                        if bad.size:
                            d = int(np.searchsorted(offsets, bad[0], side="right") - 1)
                            raise VerifyError(
                                f"{where} {name}: token {int(bad[0])} (document {d}) is {int(chunk[bad[0] - a])}, "
                                f"the document {'ends' if what == 'EOS' else 'begins'} with {what} {token}"
                            )
                hashed += n * dtype.itemsize
                got, want_meta, want_manifest = h.hexdigest(), meta.get(f"sha256.{split}"), entry["sha256"][split]
                if got != want_meta or got != want_manifest:
                    at_ = locate(k, split, shard.path) if locate else None
                    place = (
                        f"first changed token at index {at_[0]} (document {at_[1]:#x}, token {at_[2]}: stored {at_[3]}, "
                        f"the tokenizer gives {at_[4]})"
                        if at_
                        else "position not located (the shard's documents re-tokenize to its stored tokens)"
                    )
                    raise VerifyError(
                        f"{where} {name}: sha256 {got} differs from the recorded {want_manifest} "
                        f"(shard metadata {want_meta}); {place}"
                    )
                for c in ("documents", "tokens"):
                    totals[split][c] += counts[split][c]
        finally:
            shard.close()
        digest.update(fingerprint_part(entry))
    if totals != m["totals"]:
        raise VerifyError(f"{store.manifest_path}: totals {m['totals']} differ from the shards' {totals}")
    if digest.hexdigest() != m["fingerprint"]:
        raise VerifyError(f"{store.manifest_path}: fingerprint does not match its shard entries")
    return {"shards": len(m["shards"]), "bytes_hashed": hashed}


def _retokenized(store: TokenStore, tokenizer, data_cfg: dict, sources: list[str], shard: int, mix, limit: int | None):
    """(document id, expected ids) of shard `shard`'s documents in reading order, up to `limit`, in batches."""
    bos = store.manifest["tokenizer"]["bos_id"]
    plan = assign(sources, data_cfg["num_shards"], shard)
    batch, seen = [], 0

    def flush():
        out = [
            (did, ([bos] if bos >= 0 else []) + ids + [store.eos_id])
            for (did, _), ids in zip(batch, tokenizer([t for _, t in batch]))
        ]
        batch.clear()
        return out

    for s_idx, source in plan.sources:
        keep, stride, part = plan.reading(s_idx)  # a source split into byte ranges: only this shard's range
        for r_idx, text in documents(source, data_cfg, ReadStats(), mixture.keeper(mix, s_idx, keep), stride, part):
            if limit is not None and seen >= limit:
                break
            batch.append((doc_id(s_idx, r_idx), text))
            seen += 1
            if len(batch) >= 256:
                yield from flush()
        if limit is not None and seen >= limit:
            break
    if batch:
        yield from flush()


def _encoder(tokenizer_dir: Path):
    from llmpipe.data.tokenizer import HFEncoder

    return HFEncoder(tokenizer_dir, 1).encode_batch


def locate_store_change(store, tokenizer_dir, data_cfg, sources, mix, shard: int, split: str, path: Path):
    """Re-tokenize every document of one shard: the first stored token of `split` that differs."""
    s = _Shard(path)
    try:
        offsets, ids = s.tensor(f"{split}.offsets"), s.tensor(f"{split}.doc_ids")
        index = {int(d): i for i, d in enumerate(ids)}
        for did, want in _retokenized(store, _encoder(tokenizer_dir), data_cfg, sources, shard, mix, None):
            i = index.get(did)
            if i is None:
                continue
            got = s.read(f"{split}.tokens", int(offsets[i]), int(offsets[i + 1]))
            want = np.asarray(want, np.int64)
            if got.size != want.size:
                return int(offsets[i]), did, 0, f"{got.size} tokens", f"{want.size}"
            if not np.array_equal(got, want):
                j = _first_diff(got.astype(np.int64), want)[0]
                return int(offsets[i]) + j, did, j, int(got[j]), int(want[j])
    finally:
        s.close()
    return None


def check_tokenization(
    store: TokenStore, tokenizer_dir: Path, data_cfg: dict, sources: list[str], sample: int, mix: dict | None = None
) -> dict:
    """Re-tokenize up to `sample` documents per shard with the HF tokenizer; compare with the store."""
    if sample <= 0:
        return {"documents_retokenized": 0}
    encode = _encoder(tokenizer_dir)
    checked = 0
    for shard, entry in enumerate(store.manifest["shards"]):
        s = _Shard(store.root / entry["file"])
        try:
            index = {}  # doc id -> (split, start, end)
            for split in SPLITS:
                offs, ids = s.tensor(f"{split}.offsets"), s.tensor(f"{split}.doc_ids")
                index.update({int(d): (split, int(offs[i]), int(offs[i + 1])) for i, d in enumerate(ids)})
            for did, want in _retokenized(store, encode, data_cfg, sources, shard, mix, sample):
                split, a, b = index[did]
                if s.read(f"{split}.tokens", a, b).tolist() != want:
                    raise VerifyError(f"document {did:#x} (shard {shard}, {s.path}): stored ids differ from the HF tokenizer's")
                checked += 1
        finally:
            s.close()
    return {"documents_retokenized": checked}


# ---------------------------------------------------------------- packed rows


def _want_rows(stream: _Stream, layout: Layout, idx: np.ndarray, pad_id: int, doc_starts: np.ndarray | None):
    """What the pack layout puts in stream rows `idx`: ([n, L] ids, int8 mask, int32 segment ids or None).
    Built from Layout.spans (not pack.rows, which wrote them): padding is pad_id with mask 0 and
    segment -1; segment ids number the documents of a row 0, 1, ... and a wrapped part (carry) opens
    a new one."""
    n, L = idx.size, layout.row_len
    ids = np.full((n, L), pad_id, np.int64)
    mask = np.zeros((n, L), np.int8)
    segs = None if doc_starts is None else np.full((n, L), -1, np.int32)
    for j, i in enumerate(idx.tolist()):
        spans = layout.spans(i)
        real = np.concatenate([stream.read(a, b) for a, b in spans])
        ids[j, : real.size], mask[j, : real.size] = real, 1
        if segs is not None:
            doc = np.concatenate(
                [
                    np.searchsorted(doc_starts, np.arange(a, b), side="right") + k * (doc_starts.size + 1)
                    for k, (a, b) in enumerate(spans)
                ]
            )
            segs[j, : real.size] = np.concatenate([[0], np.cumsum(np.diff(doc) != 0)])
    return ids, mask, segs


def _compare(path: Path, first_row: int, stream_rows: np.ndarray, column: str, got: np.ndarray, want: np.ndarray, unit="row"):
    if got.shape != want.shape:
        raise VerifyError(f"{path}: {column} of {unit}s {first_row}.. has shape {got.shape}, expected {want.shape}")
    if not np.array_equal(got, want):
        r, p = _first_diff(got, want)
        raise VerifyError(
            f"{path}: {unit} {first_row + r} (stream row {int(stream_rows[r])}), position {p}: {column} is {got[r, p]}, "
            f"the token store and pack layout give {want[r, p]}"
        )


def _check_policy(view: str, split: str, s: dict, data_cfg: dict | None) -> None:
    """The view was packed under the configured policy (when the data config says)."""
    if not data_cfg:
        return
    want = {
        "remainder": data_cfg.get("remainder" if split == "train" else "val_remainder"),
        "shuffle": data_cfg.get("shuffle") if split == "train" else False,
        "seed": data_cfg.get("shuffle_seed"),
    }
    for k, v in want.items():
        if v is not None and s.get(k) != v:
            raise VerifyError(f"{view}/{split}: view.json says {k} {s.get(k)!r}, the data config {v!r}")


def _check_view_info(store: TokenStore, view: Path, info: dict) -> None:
    if info.get("store_fingerprint") not in (None, store.manifest["fingerprint"]):
        raise VerifyError(f"{view}/view.json: built from another token store ({info['store_fingerprint']})")
    if info.get("eos_id", store.eos_id) != store.eos_id:
        raise VerifyError(f"{view}/view.json: eos_id {info['eos_id']}, the store's is {store.eos_id}")


def verify_hf(store: TokenStore, view: Path, info: dict, data_cfg: dict | None = None) -> dict:
    import pyarrow as pa

    from llmpipe.data.views import hf

    out = {}
    seq_len = info["seq_len"]
    for split in SPLITS:
        with _labelled(f"hf/{split}"):
            s = info[split]
            _check_policy("hf", split, s, data_cfg)
            folder = view / split
            segment_ids = bool(s.get("segment_ids", False))
            if data_cfg and "segment_ids" in data_cfg and data_cfg["segment_ids"] != segment_ids:
                raise VerifyError(
                    f"hf/{split}: view.json says segment_ids {segment_ids}, the data config {data_cfg['segment_ids']}"
                )
            cols = hf._columns(segment_ids, "int16" if seq_len < 2**15 else "int32")
            data_file = "data-00000-of-00001.arrow"
            made_by = {
                "store": store.manifest["fingerprint"],
                "split": split,
                "seq_len": seq_len,
                "remainder": s["remainder"],
                "shuffle": s["shuffle"],
                "seed": s["seed"],
                "segment_ids": segment_ids,
            }
            with tempfile.TemporaryDirectory() as tmp:  # the dataset's json files, as the writer makes them
                hf._finish(
                    Path(tmp), data_file, hashlib.sha256(json.dumps(made_by, sort_keys=True).encode()).hexdigest(), cols, seq_len
                )
                for name in ("state.json", "dataset_info.json"):
                    if not (folder / name).is_file() or (folder / name).read_bytes() != (Path(tmp) / name).read_bytes():
                        raise VerifyError(f"{folder / name}: differs from what the hf view writes for this split")
            extra = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
            if extra != sorted([data_file, "state.json", "dataset_info.json"]):
                raise VerifyError(f"{folder}: holds {extra}, expected {data_file}, state.json, dataset_info.json")
            path = folder / data_file
            with _Stream(store, split) as stream:
                layout = Layout(stream.size, seq_len, s["remainder"])
                starts = stream.doc_starts() if segment_ids else None
                perm = order(layout.rows, s["shuffle"], s["seed"])
                schema = hf._schema(cols, seq_len)
                k, real = 0, 0
                with pa.OSFile(str(path)) as fh:
                    reader = pa.ipc.open_stream(fh)
                    if not reader.schema.equals(schema, check_metadata=True):
                        raise VerifyError(f"{path}: schema {reader.schema} differs from the hf view's {schema}")
                    for batch in reader:
                        n = batch.num_rows
                        if k + n > layout.rows:
                            raise VerifyError(f"{path}: more than the {layout.rows} rows the layout makes")
                        idx = perm[k : k + n]
                        ids, mask, segs = _want_rows(stream, layout, idx, store.eos_id, starts)
                        want = {"input_ids": ids, "attention_mask": mask, "labels": np.where(mask == 1, ids, IGNORE_INDEX)}
                        if segment_ids:
                            want["segment_ids"] = segs
                        for name, w in want.items():
                            col = batch.column(name)
                            if col.null_count or col.values.null_count:
                                raise VerifyError(f"{path}: {name} of rows {k}..{k + n - 1} holds nulls")
                            got = col.flatten().to_numpy(zero_copy_only=False).reshape(n, seq_len)
                            _compare(path, k, idx, name, got.astype(np.int64), w.astype(np.int64))
                        real += int(mask.sum())
                        k += n
                if k != layout.rows:
                    raise VerifyError(f"{path}: {k} rows, the layout makes {layout.rows}")
        out[split] = {"rows": layout.rows, "tokens_checked": real, "positions_checked": layout.rows * seq_len}
    return out


def verify_litgpt(store: TokenStore, view: Path, info: dict, data_cfg: dict | None = None) -> dict:
    from llmpipe.data.views.litgpt import CODES, HEADER, MAGIC, VERSION, file_dtype

    out = {}
    dtype = file_dtype(store.manifest["tokenizer"]["vocab_size"]).newbyteorder("<")
    for split, folder in (("train", "train"), ("val", "validation")):
        with _labelled(f"litgpt/{split}"):
            s = info[split]
            _check_policy("litgpt", split, s, data_cfg)
            block, per = s["block"], s["sequences_per_file"]
            if block != info["seq_len"] + 1:
                raise VerifyError(f"litgpt/{split}: block {block}, seq_len + 1 is {info['seq_len'] + 1}")
            if data_cfg and data_cfg.get("litgpt_sequences_per_file", per) != per:
                raise VerifyError(
                    f"litgpt/{split}: {per} sequences per file, the data config says {data_cfg['litgpt_sequences_per_file']}"
                )
            files = sorted(p for p in (view / folder).iterdir())
            with _Stream(store, split) as stream:
                layout = Layout(stream.size, block, s["remainder"])
                n_files = -(-layout.rows // per)
                if len(files) != n_files or s.get("files", n_files) != n_files:
                    raise VerifyError(f"litgpt/{split}: {len(files)} files in {view / folder}, the layout makes {n_files}")
                perm = order(layout.rows, s["shuffle"], s["seed"])
                real = 0
                for c, path in enumerate(files):
                    if not (path.name.startswith(f"{folder}_") and path.name.endswith(f"_0_{c:010d}.bin")):
                        raise VerifyError(f"{path}: not the name of lit-gpt file {c} of {folder}/")
                    with open(path, "rb") as fh:
                        head = fh.read(HEADER.size)
                        if len(head) != HEADER.size:
                            raise VerifyError(f"{path}: shorter than its header")
                        magic, version, code, chunk = HEADER.unpack(head)
                        if (magic, version, code, chunk) != (MAGIC, VERSION, CODES[dtype.newbyteorder("=")], block * per):
                            raise VerifyError(
                                f"{path}: header {(magic, version, code, chunk)} is not a {dtype} file of {per} blocks"
                            )
                        if path.stat().st_size != HEADER.size + chunk * dtype.itemsize:
                            raise VerifyError(f"{path}: {path.stat().st_size} bytes, its header says {chunk} tokens")
                        for j in range(0, per, ROWS_PER_STEP):
                            m = min(per, j + ROWS_PER_STEP) - j
                            got = np.frombuffer(fh.read(m * block * dtype.itemsize), dtype).reshape(m, block).astype(np.int64)
                            g = c * per + j  # sequence number across files
                            idx = perm[g : min(g + m, layout.rows)]
                            want = np.full((m, block), store.eos_id, np.int64)  # rows past the last: the pad token
                            rows_ids, mask, _ = _want_rows(stream, layout, idx, store.eos_id, None)
                            want[: idx.size] = rows_ids
                            stream_rows = np.concatenate([idx, np.full(m - idx.size, -1)])
                            _compare(path, j, stream_rows, "token", got, want, unit="sequence")
                            real += int(mask.sum())
        out[split] = {"files": len(files), "tokens_checked": real, "positions_checked": len(files) * per * block}
    return out


def verify_megatron(store: TokenStore, view: Path, info: dict, data_cfg: dict | None = None) -> dict:
    from llmpipe.data.views.litgpt import file_dtype
    from llmpipe.data.views.megatron import CODES, HEAD, MAGIC, VERSION

    dtype = file_dtype(store.manifest["tokenizer"]["vocab_size"]).newbyteorder("<")
    out = {}
    for split in SPLITS:
        with _labelled(f"megatron/{split}"):
            prefix = view / info[split]["prefix"]
            idx_path, bin_path = prefix.with_suffix(".idx"), prefix.with_suffix(".bin")
            docs, tokens = (store.manifest["totals"][split][k] for k in ("documents", "tokens"))
            if not idx_path.is_file() or not bin_path.is_file():
                raise VerifyError(f"megatron/{split}: {idx_path} or {bin_path} missing")
            with open(idx_path, "rb") as fh:
                head = fh.read(HEAD.size)
            if len(head) != HEAD.size:
                raise VerifyError(f"{idx_path}: shorter than its header")
            magic, version, code, seqs, ndocs = HEAD.unpack(head)
            if (magic, version, code, seqs, ndocs) != (MAGIC, VERSION, CODES[dtype.newbyteorder("=")], docs, docs + 1):
                raise VerifyError(
                    f"{idx_path}: header {(magic, version, code, seqs, ndocs)}, the store has {docs} documents of {dtype}"
                )
            if idx_path.stat().st_size != HEAD.size + 12 * docs + 8 * (docs + 1):
                raise VerifyError(f"{idx_path}: {idx_path.stat().st_size} bytes, its header says {docs} documents")
            if bin_path.stat().st_size != tokens * dtype.itemsize:
                raise VerifyError(f"{bin_path}: {bin_path.stat().st_size} bytes, the store has {tokens} tokens of {dtype}")
            at_len, at_ptr, at_doc = HEAD.size, HEAD.size + 4 * docs, HEAD.size + 12 * docs
            step = max(1, CHUNK_BYTES // 8)
            fi, fb = os.open(idx_path, os.O_RDONLY), os.open(bin_path, os.O_RDONLY)
            try:
                done, d0 = 0, 0  # tokens and documents before the current shard
                with _Stream(store, split) as stream:
                    for shard in stream.shards:
                        offsets = shard.tensor(f"{split}.offsets").astype(np.int64)
                        nd, n = offsets.size - 1, int(offsets[-1])
                        for a in range(0, nd, step):  # lengths and byte offsets of this shard's documents
                            b = min(nd, a + step)
                            lengths = np.frombuffer(_pread(fi, 4 * (b - a), at_len + 4 * (d0 + a), str(idx_path)), "<i4")
                            ptrs = np.frombuffer(_pread(fi, 8 * (b - a), at_ptr + 8 * (d0 + a), str(idx_path)), "<i8")
                            want_len, want_ptr = np.diff(offsets[a : b + 1]), (offsets[a:b] + done) * dtype.itemsize
                            for what, got, want in (("length", lengths, want_len), ("byte offset", ptrs, want_ptr)):
                                if not np.array_equal(got, want):
                                    r = _first_diff(got.astype(np.int64), want)[0]
                                    raise VerifyError(
                                        f"{idx_path}: document {d0 + a + r} {what} is {int(got[r])}, the token store gives {int(want[r])}"
                                    )
                        tstep = max(1, CHUNK_BYTES // dtype.itemsize)
                        for a in range(0, n, tstep):
                            b = min(n, a + tstep)
                            got = np.frombuffer(
                                _pread(fb, (b - a) * dtype.itemsize, (done + a) * dtype.itemsize, str(bin_path)), dtype
                            )
                            want = shard.read(f"{split}.tokens", a, b)
                            if not np.array_equal(got, want):  # no int64 copies: uint16 / uint32 / int32 compare as values
                                r = a + _first_diff(got.astype(np.int64), want.astype(np.int64))[0]
                                d = int(np.searchsorted(offsets, r, side="right") - 1)
                                raise VerifyError(
                                    f"{bin_path}: token {done + r} (document {d0 + d}, token {r - int(offsets[d])}) is "
                                    f"{int(got[r - a])}, the token store gives {int(want[r - a])}"
                                )
                        done, d0 = done + n, d0 + nd
                for a in range(0, docs + 1, step):
                    b = min(docs + 1, a + step)
                    got = np.frombuffer(_pread(fi, 8 * (b - a), at_doc + 8 * a, str(idx_path)), "<i8")
                    if not np.array_equal(got, np.arange(a, b)):
                        r = _first_diff(got, np.arange(a, b))[0]
                        raise VerifyError(f"{idx_path}: document index entry {a + r} is {int(got[r])}, expected {a + r}")
            finally:
                os.close(fi)
                os.close(fb)
            if done != tokens or d0 != docs:
                raise VerifyError(
                    f"megatron/{split}: the shards hold {done} tokens / {d0} documents, the manifest {tokens} / {docs}"
                )
        out[split] = {"documents": docs, "tokens_checked": done}
    return out


def verify(
    manifest: str | Path, views: list[Path], tokenizer_dir: Path, sources_json: Path, data_cfg: dict, out: Path, sample: int = 64
) -> dict:
    store = TokenStore(manifest)
    sources = load_sources(sources_json)  # with the byte ranges of split sources
    mix = mixture.load(sources_json)
    result = {
        "tokenizer": store.manifest["tokenizer"],
        "sources": json.loads(Path(sources_json).read_text()),
        "documents": {s: store.manifest["totals"][s]["documents"] for s in SPLITS},
        "tokens": {s: store.manifest["totals"][s]["tokens"] for s in SPLITS},
        "read": store.manifest["read"],
        "views": {},
        "files": {},
    }

    def locate(shard, split, path):
        return locate_store_change(store, tokenizer_dir, data_cfg, sources, mix, shard, split, path)

    result["store"] = check_store(store, locate)
    result["tokenization"] = check_tokenization(store, tokenizer_dir, data_cfg, sources, sample, mix)
    for view in views:
        info = json.loads((view / "view.json").read_text())
        _check_view_info(store, view, info)
        check = {"hf": verify_hf, "litgpt": verify_litgpt, "megatron": verify_megatron}[info["format"]]
        result["views"][info["format"]] = {"conservation": check(store, view, info, data_cfg), **{s: info[s] for s in SPLITS}}
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
