"""verify: re-read the token store and every view, exactly and streaming, and write the run's data
stats (counts, skips, sha256 of every file).

- Token store (data/verify_store.py): each shard's `<split>.tokens` bytes are hashed and compared with the sha256 that
  tokenize recorded (shard metadata and manifest), document offsets are checked against the tokens
  (EOS closes every document, BOS opens it when the policy adds one), the manifest's counts and
  fingerprint are recomputed; a changed token is located by re-tokenizing the shard's documents.
  A sample of documents per shard is re-tokenized with the HF tokenizer.
- Views: every value a trainer reads (hf: input_ids, attention_mask, labels, segment_ids, and the
  dataset's state.json / dataset_info.json; litgpt: every token of every file, padding included;
  megatron: tokens, lengths, byte offsets, document index) is compared with what the pack layout
  (pack.Layout, pack.order) makes of the store, under every remainder policy. A difference names the
  file and the row / token position. view.json too: its counts (copied into the stats) are the layout's,
  its store fingerprint, tokenizer and eos are the store's, its fingerprint (what a run resumes on) the
  one this store and config give.

Memory stays flat as the corpus grows: files are read in bounded chunks with plain reads (no memory
map keeps pages resident); what is held whole is O(rows + documents): the row order and document starts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

import numpy as np

from llmpipe.data.get_data import read_sources
from llmpipe.data.pack import IGNORE_INDEX, Layout, order
from llmpipe.data.token_store import SPLITS, TokenStore
from llmpipe.data.verify_store import (
    CHUNK_BYTES,
    ROWS_PER_STEP,
    VerifyError,
    _first_diff,
    _labelled,
    _pread,
    _Stream,
    check_store,
    check_tokenization,
    locate_store_change,
)
from llmpipe.io import sha256_file, write_json

log = logging.getLogger(__name__)


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
    """view.json's identity (what training, evaluate and plan trust) against the store."""
    if info.get("store_fingerprint") != store.manifest["fingerprint"]:
        raise VerifyError(
            f"{view}/view.json: store_fingerprint {info.get('store_fingerprint')}: built from another token store "
            f"than {store.manifest_path} ({store.manifest['fingerprint']})"
        )
    if info.get("eos_id") != store.eos_id:
        raise VerifyError(f"{view}/view.json: eos_id {info.get('eos_id')}, the store's is {store.eos_id}")
    if info.get("tokenizer_sha256") != store.manifest["tokenizer"]["sha256"]:
        raise VerifyError(
            f"{view}/view.json: tokenizer_sha256 {info.get('tokenizer_sha256')}, the store's is {store.manifest['tokenizer']['sha256']}"
        )


def _check_view_key(store: TokenStore, view: Path, info: dict, data_cfg: dict | None) -> None:
    """view.json's fingerprint (what a run resumes on) is the one this store and config give (after the view's
    own checks, which name a differing setting)."""
    from llmpipe.data.pack_views import FORMAT_KEYS, view_key

    if data_cfg and all(k in data_cfg for k in FORMAT_KEYS[info["format"]]):
        want = view_key(store, info["format"], {"data": data_cfg, "train": {"seq_len": info["seq_len"]}})
        if info.get("fingerprint") != want:
            raise VerifyError(f"{view}/view.json: fingerprint {info.get('fingerprint')}, this store and config make {want}")


SNAKEMAKE_MARK = ".snakemake_timestamp"  # Snakemake's own file in a directory() output


def _check_view_entries(view: Path, info: dict) -> None:
    """A view folder holds what its writer makes and nothing else (each split's own files are checked with it)."""
    if info["format"] == "megatron":
        want = {"view.json", *(info[s]["prefix"] + ext for s in SPLITS for ext in (".bin", ".idx"))}
    else:
        want = {"view.json", *{"hf": ("train", "val"), "litgpt": ("train", "validation")}[info["format"]]}
    extra = sorted(p.name for p in view.iterdir() if p.name not in want and p.name != SNAKEMAKE_MARK)
    if extra:
        raise VerifyError(f"{view}: holds {', '.join(extra)}, which the {info['format']} view does not write")


def _store_files(store: TokenStore) -> tuple[list[Path], list[str]]:
    """(the store's files: manifest, shards and their jobs' read stats; the other files under its folder, such
    as the job folders of an earlier data.shards_per_job, which Snakemake leaves in place)."""
    from llmpipe.data.tokenize import READ_FILE

    shards = [store.root / e["file"] for e in store.manifest["shards"]]
    reads = {s.parent / READ_FILE for s in shards if (s.parent / READ_FILE).is_file()}
    ours = {store.manifest_path, *shards, *reads}
    stray = sorted(str(p) for p in store.root.rglob("*") if p.is_file() and p not in ours and p.name != SNAKEMAKE_MARK)
    if stray:
        log.warning("%d files under %s are not part of its manifest (not hashed): %s", len(stray), store.root, stray[:5])
    return sorted(ours), stray


def _check_counts(where: str, recorded: dict, made: dict) -> None:
    """The counts view.json records for a split (copied into stats.json) against those of the layout checked."""
    for key, value in made.items():
        if recorded.get(key) != value:
            raise VerifyError(f"{where}: view.json says {key} {recorded.get(key)!r}, the view holds {value!r}")


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
            with _Stream(store, split) as stream:
                layout = Layout(stream.size, seq_len, s["remainder"])
                _check_counts(f"hf/{split}", s, layout.stats())
                files = hf.data_files(layout.rows, hf.row_bytes(cols, seq_len))
                names = [name for name, _ in files]
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
                        Path(tmp), names, hashlib.sha256(json.dumps(made_by, sort_keys=True).encode()).hexdigest(), cols, seq_len
                    )
                    for name in ("state.json", "dataset_info.json"):
                        if not (folder / name).is_file() or (folder / name).read_bytes() != (Path(tmp) / name).read_bytes():
                            raise VerifyError(f"{folder / name}: differs from what the hf view writes for this split")
                extra = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
                if extra != sorted([*names, "state.json", "dataset_info.json"]):
                    raise VerifyError(f"{folder}: holds {extra}, expected {', '.join(names)}, state.json, dataset_info.json")
                starts = stream.doc_starts() if segment_ids else None
                perm = order(layout.rows, s["shuffle"], s["seed"])
                schema = hf._schema(cols, seq_len)
                k, real = 0, 0
                for name, part in files:
                    path = folder / name
                    try:  # a cut or damaged file: named, with the row reached
                        with pa.OSFile(str(path)) as fh:
                            reader = pa.ipc.open_stream(fh)
                            if not reader.schema.equals(schema, check_metadata=True):
                                raise VerifyError(f"{path}: schema {reader.schema} differs from the hf view's {schema}")
                            for batch in reader:
                                n = batch.num_rows
                                if k + n > part.stop:
                                    raise VerifyError(f"{path}: more than the {len(part)} rows of this file ({part.start}..)")
                                idx = perm[k : k + n]
                                ids, mask, segs = _want_rows(stream, layout, idx, store.eos_id, starts)
                                want = {
                                    "input_ids": ids,
                                    "attention_mask": mask,
                                    "labels": np.where(mask == 1, ids, IGNORE_INDEX),
                                }
                                if segment_ids:
                                    want["segment_ids"] = segs
                                for col_name, w in want.items():
                                    col = batch.column(col_name)
                                    if col.null_count or col.values.null_count:
                                        raise VerifyError(f"{path}: {col_name} of rows {k}..{k + n - 1} holds nulls")
                                    got = col.flatten().to_numpy(zero_copy_only=False).reshape(n, seq_len)
                                    _compare(path, k, idx, col_name, got.astype(np.int64), w.astype(np.int64))
                                real += int(mask.sum())
                                k += n
                    except (pa.ArrowInvalid, OSError) as exc:
                        raise VerifyError(
                            f"{path}: unreadable after row {k} of the split ({type(exc).__name__}: {exc})"
                        ) from None
                    if k != part.stop:
                        raise VerifyError(f"{path}: {k - part.start} rows, the layout puts {len(part)} in this file")
        out[split] = {"rows": layout.rows, "tokens_checked": real, "positions_checked": layout.rows * seq_len}
    return out


def verify_litgpt(store: TokenStore, view: Path, info: dict, data_cfg: dict | None = None) -> dict:
    from llmpipe.data.views.litgpt import CODES, HEADER, MAGIC, VERSION, blocks_per_file, file_dtype

    out = {}
    dtype = file_dtype(store.manifest["tokenizer"]["vocab_size"]).newbyteorder("<")
    for split, folder in (("train", "train"), ("val", "validation")):
        with _labelled(f"litgpt/{split}"):
            s = info[split]
            _check_policy("litgpt", split, s, data_cfg)
            block, per = s["block"], s["sequences_per_file"]
            if block != info["seq_len"] + 1:
                raise VerifyError(f"litgpt/{split}: block {block}, seq_len + 1 is {info['seq_len'] + 1}")
            files = sorted(p for p in (view / folder).iterdir())
            with _Stream(store, split) as stream:
                layout = Layout(stream.size, block, s["remainder"])
                most = data_cfg.get("litgpt_sequences_per_file") if data_cfg else None
                if most is not None and blocks_per_file(layout.rows, most) != per:
                    raise VerifyError(
                        f"litgpt/{split}: {per} sequences per file, data.litgpt_sequences_per_file {most} makes "
                        f"{blocks_per_file(layout.rows, most)} for its {layout.rows} rows"
                    )
                n_files = -(-layout.rows // per)
                if len(files) != n_files:
                    raise VerifyError(f"litgpt/{split}: {len(files)} files in {view / folder}, the layout makes {n_files}")
                made = {**layout.stats(), "files": n_files, "file_pad_tokens": (n_files * per - layout.rows) * block}
                _check_counts(f"litgpt/{split}", s, {**made, "dtype": dtype.newbyteorder("=").name})
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
            if not docs:
                raise VerifyError(f"megatron/{split}: no documents (Megatron cannot read an empty split)")
            if not idx_path.is_file() or not bin_path.is_file():
                raise VerifyError(f"megatron/{split}: {idx_path} or {bin_path} missing")
            with open(idx_path, "rb") as fh:
                head = fh.read(HEAD.size)
            if len(head) != HEAD.size:
                raise VerifyError(f"{idx_path}: shorter than its header")
            magic, version, code, seqs, ndocs = HEAD.unpack(head)
            _check_counts(
                f"megatron/{split}", info[split], {"documents": docs, "tokens": tokens, "dtype": dtype.newbyteorder("=").name}
            )
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
    sources, listed = read_sources(sources_json)  # names with the byte ranges of split sources
    mix = listed.get("mixture")
    result = {
        "tokenizer": store.manifest["tokenizer"],
        "sources": listed,
        "documents": {s: store.manifest["totals"][s]["documents"] for s in SPLITS},
        "tokens": {s: store.manifest["totals"][s]["tokens"] for s in SPLITS},
        "read": store.manifest["read"],
        "source_sha256": store.manifest.get("source_sha256"),  # taken by the tokenize jobs as they read
        **({"by_group": store.manifest["by_group"]} if "by_group" in store.manifest else {}),  # checked by check_store
        "views": {},
        "files": {},
    }

    def locate(shard, split, path):
        return locate_store_change(store, tokenizer_dir, data_cfg, sources, mix, shard, split, path)

    result["store"] = check_store(store, locate, mix)
    result["tokenization"] = check_tokenization(store, tokenizer_dir, data_cfg, sources, sample, mix)
    for view in views:
        info = json.loads((view / "view.json").read_text())
        _check_view_info(store, view, info)
        check = {"hf": verify_hf, "litgpt": verify_litgpt, "megatron": verify_megatron}[info["format"]]
        result["views"][info["format"]] = {"conservation": check(store, view, info, data_cfg), **{s: info[s] for s in SPLITS}}
        _check_view_key(store, view, info, data_cfg)
        _check_view_entries(view, info)
    files, result["stray"] = _store_files(store)
    for view in views:
        files += sorted(p for p in view.rglob("*") if p.is_file() and p.name != SNAKEMAKE_MARK)
    for f in files:
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
    try:
        verify(
            args.store,
            [Path(v) for v in args.views],
            Path(args.tokenizer),
            Path(args.sources),
            cfgmod.load(args.config)["data"],
            Path(args.out),
            args.sample,
        )
    except ValueError as exc:  # a sources.json of another config or an older llmpipe: one line, as tokenize
        raise SystemExit(f"llmpipe verify: error: {exc}") from None
