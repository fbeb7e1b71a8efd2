"""verify, the token store: each shard's token bytes against the sha256 tokenize recorded, document
offsets against the tokens, the manifest's counts and fingerprint recomputed, a changed token located by
re-tokenizing the shard's documents, and a sample re-tokenized with the HF tokenizer. Files are read in
bounded chunks (flat memory). The views and the CLI: data/verify.py."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections import OrderedDict
from itertools import islice
from pathlib import Path

import numpy as np

from llmpipe.data import mixture, stfile
from llmpipe.data.readers import ReadStats, documents
from llmpipe.data.sources import assign, doc_id
from llmpipe.data.token_store import MAPS_OPEN, SPLITS, TokenStore, fingerprint_part

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


def _st_header(path: Path) -> tuple[dict, int]:
    """(safetensors header, byte where the tensor data starts)."""
    try:
        return stfile.header(path)
    except ValueError as exc:
        raise VerifyError(str(exc)) from None


_OPEN: OrderedDict[int, _Shard] = OrderedDict()  # shards with an open file, the least recently read first


class _Shard:
    """One store shard's tensors, read with pread. Its file is opened when first read and stays open while it is
    among the MAPS_OPEN shards read last (token_store.ShardMaps' bound): a store of any shard count verifies
    within a 1024 open-files limit."""

    def __init__(self, path: Path):
        self.path = path
        self.header, self.base = _st_header(path)
        self.meta = self.header.get("__metadata__", {})
        self._fd: int | None = None

    @property
    def fd(self) -> int:
        _OPEN.pop(id(self), None)
        if self._fd is None:
            while len(_OPEN) >= MAPS_OPEN:
                _OPEN.popitem(last=False)[1].close()
            self._fd = os.open(self.path, os.O_RDONLY)
        _OPEN[id(self)] = self
        return self._fd

    def close(self) -> None:
        _OPEN.pop(id(self), None)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

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


def check_store(store: TokenStore, locate=None, mix: dict | None = None) -> dict:
    """Every shard against its recorded sha256, counts and tokenizer; the manifest against its shards
    (totals, fingerprint, read stats, per-source and, with the mixture plan `mix`, per-group counts).
    `locate(shard, split, shard_file)`: on a hash mismatch, (token index, document id, index in the
    document, stored, expected) of the first changed token, or None."""
    from llmpipe.data.tokenize import token_dtype

    m = store.manifest
    tok = m["tokenizer"]
    eos, bos = int(tok["eos_id"]), int(tok["bos_id"])
    want_dtype = token_dtype(int(tok["vocab_size"])).newbyteorder("<")
    digest = hashlib.sha256((m.get("sources_key") or "").encode())
    totals = {s: {"documents": 0, "tokens": 0} for s in SPLITS}
    read, by_source = ReadStats(), {}
    hashed = 0
    for k, entry in enumerate(m["shards"]):
        shard = _Shard(store.root / entry["file"])
        where = str(shard.path)
        seen_ids, arrays = [], {}
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
                if (np.diff(ids) < 1).any():  # tokenize writes each shard's documents in source and record order
                    at_ = int(np.flatnonzero(np.diff(ids) < 1)[0]) + 1
                    raise VerifyError(f"{where} {split}.doc_ids: document {at_} ({int(ids[at_]):#x}) repeats or is out of place")
                seen_ids.append(ids)
                arrays[split] = (offsets, ids)
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
            both = np.intersect1d(*seen_ids)
            if both.size:
                raise VerifyError(f"{where}: document {int(both[0]):#x} is in both train and val")
            read.add(json.loads(meta["read"]))
            mixture.add_counts(by_source, mixture.counts_of(arrays))
        finally:
            shard.close()
        digest.update(fingerprint_part(entry))
    if totals != m["totals"]:
        raise VerifyError(f"{store.manifest_path}: totals {m['totals']} differ from the shards' {totals}")
    if digest.hexdigest() != m["fingerprint"]:
        raise VerifyError(f"{store.manifest_path}: fingerprint does not match its shard entries")
    made = {"read": read.as_dict(), "by_source": by_source}  # what the report, stats.json and the card show
    if mix and "by_group" in m:
        made["by_group"] = mixture.group_counts(by_source, mix)
    for key, value in made.items():
        if json.loads(json.dumps(value)) != m.get(key):
            raise VerifyError(f"{store.manifest_path}: {key} {m.get(key)} differs from its shards' {value}")
    return {"shards": len(m["shards"]), "bytes_hashed": hashed}


def _shard_docs(data_cfg: dict, sources: list[str], shard: int, mix):
    """(document id, text) of shard `shard`'s documents in its reading order (tokenize_shard's)."""
    plan = assign(sources, data_cfg["num_shards"], shard)
    for s_idx, source in plan.sources:
        keep, stride, part = plan.reading(s_idx)  # a source split into byte ranges: only this shard's range
        for r_idx, text in documents(source, data_cfg, ReadStats(), mixture.keeper(mix, s_idx, keep), stride, part):
            yield doc_id(s_idx, r_idx), text


def _samples(data_cfg: dict, sources: list[str], mix, sample: int):
    """(shard, document id, text): each shard's first `sample` documents in its reading order, each source
    read at most once for all the shards. A source dealt record by record across the shards (fewer
    sources than shards) is read once, dealing to the shards until each has its sample: read once per
    shard, it was read up to num_shards times."""
    n = data_cfg["num_shards"]
    if not assign(sources, n, 0).record_level:  # whole sources, each read by its one shard
        for shard in range(n):
            yield from ((shard, did, text) for did, text in islice(_shard_docs(data_cfg, sources, shard, mix), sample))
        return
    counts, full = [0] * n, 0
    plans = [assign(sources, n, shard) for shard in range(n)]
    for s_idx, source in plans[0].sources:
        if full == n:
            return
        ranged = any(i == s_idx for i, _ in plans[0].ranges)  # byte ranges: each shard reads its own
        for shard in range(n) if ranged else (None,):
            if shard is not None and counts[shard] >= sample:
                continue
            keep, stride, part = plans[shard].reading(s_idx) if ranged else ((lambda r: counts[r % n] < sample), None, None)
            for r_idx, text in documents(source, data_cfg, ReadStats(), mixture.keeper(mix, s_idx, keep), stride, part):
                into = r_idx % n if shard is None else shard
                yield into, doc_id(s_idx, r_idx), text
                counts[into] += 1
                full += counts[into] == sample
                if (shard is not None and counts[shard] >= sample) or full == n:
                    break


def _encoded(store: TokenStore, tokenizer, docs):
    """(key, expected ids) for (key, text) pairs, in batches; a document the encoder drops
    (data.long_pretoken: skip, as tokenize drops it) is left out."""
    bos = store.manifest["tokenizer"]["bos_id"]
    batch = []

    def flush():
        out = [
            (key, ([bos] if bos >= 0 else []) + ids + [store.eos_id])
            for (key, _), ids in zip(batch, tokenizer([t for _, t in batch]))
            if ids is not None
        ]
        batch.clear()
        return out

    for key, text in docs:
        batch.append((key, text))
        if len(batch) >= 256:
            yield from flush()
    if batch:
        yield from flush()


def _digest(ids) -> bytes:
    return hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), digest_size=16).digest()


def _encoder(tokenizer_dir: Path, data_cfg: dict):
    from llmpipe.data.encoders import HFEncoder

    return HFEncoder(tokenizer_dir, 1, long_pretoken=data_cfg.get("long_pretoken", "split")).encode_batch


def locate_store_change(store, tokenizer_dir, data_cfg, sources, mix, shard: int, split: str, path: Path):
    """Re-tokenize every document of one shard: the first stored token of `split` that differs."""
    s = _Shard(path)
    try:
        offsets, ids = s.tensor(f"{split}.offsets"), s.tensor(f"{split}.doc_ids")
        index = {int(d): i for i, d in enumerate(ids)}
        for did, want in _encoded(store, _encoder(tokenizer_dir, data_cfg), _shard_docs(data_cfg, sources, shard, mix)):
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
    docs = (((shard, did), text) for shard, did, text in _samples(data_cfg, sources, mix, sample))
    want = {}  # shard -> {doc id: digest of its expected ids}: small, whatever the shard count
    for (shard, did), ids in _encoded(store, _encoder(tokenizer_dir, data_cfg), docs):
        want.setdefault(shard, {})[did] = _digest(ids)
    checked = 0
    for shard, entry in enumerate(store.manifest["shards"]):
        if shard not in want:
            continue
        s = _Shard(store.root / entry["file"])
        try:
            index = {}  # doc id -> (split, start, end)
            for split in SPLITS:
                offs, ids = s.tensor(f"{split}.offsets"), s.tensor(f"{split}.doc_ids")
                index.update({int(d): (split, int(offs[i]), int(offs[i + 1])) for i, d in enumerate(ids)})
            for did, digest in want[shard].items():
                if did not in index:
                    raise VerifyError(f"document {did:#x} (shard {shard}) is read from the sources but missing from {s.path}")
                split, a, b = index[did]
                if _digest(s.read(f"{split}.tokens", a, b)) != digest:
                    raise VerifyError(f"document {did:#x} (shard {shard}, {s.path}): stored ids differ from the HF tokenizer's")
                checked += 1
        finally:
            s.close()
    return {"documents_retokenized": checked}
