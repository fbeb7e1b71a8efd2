"""Token store (gather): the canonical tokens, written once by the tokenize shards, indexed by manifest.json.

Layout of <store>/: [job-XXXXX/]shard-XXXXX.safetensors (see tokenize.py) + manifest.json (shard order, counts,
read stats, tokenizer fingerprint, the sources key, a content fingerprint). Every view is built from
this store through `TokenStore.split(name)`, a random-access view of one split's token stream.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np
from safetensors import safe_open

from llmpipe.data import mixture, stfile
from llmpipe.data.readers import ReadStats
from llmpipe.io import write_json

log = logging.getLogger(__name__)

FORMAT = "llmpipe-token-store/1"
SPLITS = ("train", "val")


def fingerprint_part(entry: dict) -> bytes:
    """A shard entry's share of the store fingerprint: its file's name, not the tokenize job folder it is in
    (the store is the same however shards were grouped into jobs)."""
    return json.dumps({**entry, "file": Path(entry["file"]).name}, sort_keys=True).encode()


def build_manifest(
    shards: list[str | Path],
    out: str | Path,
    sources_key: str | None = None,
    mix: dict | None = None,
    reads: dict | None = None,
    checksums: dict | None = None,
) -> dict:
    """`mix`: the mixture plan of sources.json, for per-group counts (per-source counts are always made);
    `reads`: source_reads() of the tokenize jobs; `checksums`: source_checksums() of them."""
    shards, out = [Path(s) for s in shards], Path(out)
    entries, tokenizer = [], None
    totals = {s: {"documents": 0, "tokens": 0} for s in SPLITS}
    read = ReadStats()
    by_source: dict = {}
    digest = hashlib.sha256((sources_key or "").encode())
    root = out.parent.resolve()
    places = []  # (shard index, shard count) from each shard's metadata
    for path in shards:
        if not path.resolve().is_relative_to(root):
            raise ValueError(f"token shard {path} is not inside the store folder {out.parent}")
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata()
            mixture.add_counts(by_source, mixture.source_counts(f, SPLITS))
        tok = {k: meta[k] for k in ("tokenizer_sha256", "eos_id", "bos_id", "vocab_size", "key")}
        if tokenizer is None:
            tokenizer = tok
        elif tok != tokenizer:
            raise ValueError(
                f"token shard {path} was made with a different tokenizer or data setup ({tok} vs {tokenizer}): "
                "retokenize every shard"
            )
        if "shard" in meta:
            places.append(tuple(int(x) for x in meta["shard"].split("/")))
        counts = json.loads(meta["counts"])
        for split in SPLITS:
            for k in ("documents", "tokens"):
                totals[split][k] += counts[split][k]
        read.add(json.loads(meta["read"]))
        entries.append(
            {
                "file": path.resolve().relative_to(root).as_posix(),
                "counts": counts,
                "encoder": meta["encoder"],
                "sha256": {s: meta[f"sha256.{s}"] for s in SPLITS},
            }
        )
        digest.update(fingerprint_part(entries[-1]))
    _check_complete(places, out)
    manifest = {
        "format": FORMAT,
        "tokenizer": {
            "sha256": tokenizer["tokenizer_sha256"],
            "eos_id": int(tokenizer["eos_id"]),
            "bos_id": int(tokenizer["bos_id"]),
            "vocab_size": int(tokenizer["vocab_size"]),
        },
        "sources_key": sources_key,
        "key": tokenizer["key"],
        "shards": entries,
        "totals": totals,
        "read": read.as_dict(),
        "fingerprint": digest.hexdigest(),
        "by_source": by_source,  # source index (sources.json order) -> split -> documents, tokens stored
        **({"by_group": mixture.group_counts(by_source, mix)} if mix else {}),
        **({"source_reads": reads} if reads else {}),
        **({"source_sha256": checksums} if checksums else {}),
    }
    write_json(out, manifest)
    log.info("token store %s: %s; read %s", out.parent, totals, manifest["read"])
    return manifest


MAPS_OPEN = 128  # shard tensors a stream keeps memory-mapped at once: each map holds a file descriptor


class ShardMaps:
    """Tensor `name` of each shard file as a read-only memory map (stfile.memmap: ~3x cheaper a slice than
    safe_open), mapped when first asked and kept for the MAPS_OPEN most recently asked, so the open files stay
    bounded whatever the shard count (10,000 shards would pass a 1024 open-files limit); `trim` drops the
    last `trim` elements (an offsets tensor's end). Thread-safe (pack makes batches on several threads)."""

    def __init__(self, paths: list[Path], name: str, trim: int = 0):
        self.paths, self.name, self.trim = paths, name, trim
        self._at = [stfile.located_in(p, name) for p in paths]  # each header read once
        self.sizes = [info["shape"][0] - trim for info, _ in self._at]
        self._open: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> np.ndarray:
        with self._lock:
            got = self._open.pop(i, None)
            if got is None:
                got = stfile.memmap(self.paths[i], self.name, self._at[i])
                got = got[: got.size - self.trim] if self.trim else got
                while len(self._open) >= MAPS_OPEN:  # closed once no slice of it is left
                    self._open.popitem(last=False)
            self._open[i] = got
            return got


class SplitStream:
    """One split's token stream: every shard's tokens, in manifest order, as one random-access array."""

    def __init__(self, root: Path, files: list[str], split: str):
        self.split, self._paths = split, [root / f for f in files]
        self._tokens = ShardMaps(self._paths, f"{split}.tokens")
        self.dtype = self._tokens[0].dtype if self._paths else np.dtype(np.uint16)
        self.starts = np.concatenate([[0], np.cumsum(self._tokens.sizes)]).astype(np.int64)
        self.size = int(self.starts[-1])

    def read(self, a: int, b: int) -> np.ndarray:
        """Tokens [a, b) as int64."""
        return self.view(a, b).astype(np.int64)

    def view(self, a: int, b: int) -> np.ndarray:
        """Tokens [a, b) in the store's dtype (read-only; a copy only when they span shards)."""
        if not 0 <= a <= b <= self.size:
            raise IndexError(f"[{a}, {b}) outside the {self.split} stream of {self.size} tokens")
        parts, i = [], int(np.searchsorted(self.starts, a, side="right") - 1)
        while a < b:
            lo, hi = a - int(self.starts[i]), min(b, int(self.starts[i + 1])) - int(self.starts[i])
            parts.append(self._tokens[i][lo:hi])
            a = int(self.starts[i]) + hi
            i += 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, self.dtype)

    def full_rows(self, idx: np.ndarray, length: int, out: np.ndarray) -> None:
        """out[k] = tokens [idx[k] * length, (idx[k] + 1) * length), cast to out's dtype. The rows inside one
        shard are gathered from a [rows, length] view of it in one numpy call (no Python loop a row; numpy
        frees the GIL meanwhile), the few that cross a shard boundary one by one."""
        a = np.asarray(idx, np.int64) * length
        shard = np.searchsorted(self.starts, a, side="right") - 1
        inside = a + length <= self.starts[shard + 1]
        for s in np.unique(shard[inside]).tolist():
            sel = np.flatnonzero(inside & (shard == s))
            base, tokens = int(self.starts[s]), self._tokens[s].view(np.ndarray)
            first = -(-base // length)  # the first row that starts in this shard
            phase = first * length - base
            grid = tokens[phase : phase + (tokens.size - phase) // length * length].reshape(-1, length)
            got = np.take(grid, a[sel] // length - first, axis=0)
            if sel.size == len(a):
                out[...] = got
            else:
                out[sel] = got
        for k in np.flatnonzero(~inside).tolist():
            out[k] = self.view(int(a[k]), int(a[k]) + length)

    def doc_starts(self) -> np.ndarray:
        """Stream positions where each document begins (all shards), in memory (8 bytes a document)."""
        offsets = ShardMaps(self._paths, f"{self.split}.offsets", trim=1)
        parts = [offsets[i] + base for i, base in enumerate(self.starts[: len(offsets)].tolist())]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def lazy_doc_starts(self) -> DocStarts:
        """doc_starts() answered from the shards' memory-mapped offsets: no array of every document (pack)."""
        return DocStarts(ShardMaps(self._paths, f"{self.split}.offsets", trim=1), self.starts)


class DocStarts:
    """The stream positions where documents begin, as the shards' offsets (each from its shard's base),
    never concatenated: what pack asks of them (searchsorted, indexing, size) per batch, so its memory does
    not grow with the number of documents (an array of them all was 8 bytes a document, 16 while built)."""

    def __init__(self, offsets: ShardMaps | list[np.ndarray], bases: np.ndarray):
        self.offsets, self.bases = offsets, np.asarray(bases[: len(offsets)], np.int64)
        sizes = offsets.sizes if isinstance(offsets, ShardMaps) else [o.size for o in offsets]
        self.before = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.size = int(self.before[-1])

    def searchsorted(self, v, side: str = "left") -> np.ndarray:
        v = np.asarray(v, np.int64)
        shard = np.clip(np.searchsorted(self.bases, v, side="right") - 1, 0, None)
        out = np.empty(v.shape, np.int64)
        for s in np.unique(shard).tolist():
            sel = shard == s
            out[sel] = self.before[s] + np.searchsorted(self.offsets[s], v[sel] - self.bases[s], side=side)
        return out

    def __getitem__(self, i) -> np.ndarray:
        i = np.asarray(i, np.int64)
        shard = np.searchsorted(self.before, i, side="right") - 1
        out = np.empty(i.shape, np.int64)
        for s in np.unique(shard).tolist():
            sel = shard == s
            out[sel] = self.offsets[s][i[sel] - self.before[s]] + self.bases[s]
        return out


class TokenStore:
    """Read access to a token store through its manifest."""

    def __init__(self, manifest: str | Path):
        self.manifest_path = Path(manifest)
        self.root = self.manifest_path.parent
        self.manifest = json.loads(self.manifest_path.read_text())
        if self.manifest.get("format") != FORMAT:
            raise ValueError(f"{manifest}: not a {FORMAT} manifest")

    @property
    def eos_id(self) -> int:
        return self.manifest["tokenizer"]["eos_id"]

    def split(self, name: str) -> SplitStream:
        return SplitStream(self.root, [e["file"] for e in self.manifest["shards"]], name)

    def tokens(self, split: str) -> np.ndarray:
        """The whole split in memory (tests and small data only)."""
        s = self.split(split)
        return s.read(0, s.size)


def _check_complete(places: list[tuple[int, int]], out: Path) -> None:
    """The shards given are shards 0..n-1 of n, in order: a tokenize job killed part way leaves some of its
    shards, which would otherwise make a smaller store that looks complete."""
    if not places:  # shards written before their metadata named their place
        return
    n = places[0][1]
    got = [i for i, _ in places]
    if got != list(range(n)):
        missing = sorted(set(range(n)) - set(got))
        what = f"shards {_ranges(missing)} missing" if missing else f"shards out of order or repeated ({_ranges(got)})"
        raise ValueError(f"token store {out}: {len(got)} shards given for {n}, {what}: run their tokenize jobs again")


def _ranges(nums: list[int]) -> str:
    """1, 2, 3, 7 -> '1-3, 7' (the first 10 runs)."""
    runs: list[list[int]] = []
    for x in nums:
        if runs and x == runs[-1][1] + 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    text = ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs[:10])
    return text + (", ..." if len(runs) > 10 else "")


def shard_files(paths: list[str]) -> list[Path]:
    """Shard files in store order: a folder (one tokenize job's output) stands for its shards, sorted."""
    out = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(path.glob("shard-*.safetensors"), key=lambda f: int(f.name[6:].split(".")[0]))  # 99999 < 100000
            if not found:
                raise ValueError(f"tokenize job folder {path} holds no shard-*.safetensors")
            out.extend(found)
        else:
            out.append(path)
    return out


SHOW_OVER_READ = 20


def job_reads(job_dirs: list[Path]) -> list[tuple[dict, Path]]:
    """Each tokenize job folder's read.json (what it read and hashed), parsed once, with the folder."""
    from llmpipe.data.tokenize import READ_FILE

    missing = [str(d) for d in job_dirs if not (d / READ_FILE).is_file()]
    if missing:  # written last, atomically: the job did not finish
        raise ValueError(f"tokenize job folder {missing[0]} has no {READ_FILE} (the job did not finish): run it again")
    return [(json.loads((d / READ_FILE).read_text()), d) for d in job_dirs]


def source_reads(jobs: list[tuple[dict, Path]], entries: list[dict], scanned: dict | None = None) -> dict | None:
    """Bytes the tokenize jobs (job_reads), and get-data's reads to find the cuts of the files it cut into byte
    ranges (`scanned`: sources.json), read from the sources against the sources' sizes (sources.json's entries):
    ratio 1.0 is one read of every byte. Sources read more (or less) than once are listed, the first 20."""
    if not jobs:
        return None
    read: dict[str, int] = dict(scanned or {})
    for info, _ in jobs:
        for src, n in info["bytes_read"].items():
            read[src] = read.get(src, 0) + n
    sized = {e["source"]: e["size"] for e in entries if e.get("size")}
    total, got = sum(sized.values()), sum(read.get(src, 0) for src in sized)
    other = {src: {"size": size, "bytes_read": read.get(src, 0)} for src, size in sized.items() if read.get(src, 0) != size}
    return {
        "source_bytes": total,
        "bytes_read": got,
        "get_data_bytes": sum((scanned or {}).values()),
        "ratio": round(got / total, 4) if total else None,
        "not_read_once": dict(list(other.items())[:SHOW_OVER_READ]),
        "not_read_once_total": len(other),
    }


def source_checksums(jobs: list[tuple[dict, Path]], entries: list[dict]) -> dict | None:
    """The local sources' sha256 from the tokenize jobs' read.json (job_reads; each job hashes what it reads)."""
    return merge_checksums([(info.get("sha256", []), d) for info, d in jobs], entries)


def merge_checksums(found: list[tuple[list, object]], entries: list[dict]) -> dict | None:
    """{source: sha256}; a source cut into byte ranges: {source: [[start, end, sha256], ...]} of its ranges.
    found: ([source index, start, end, sha256] lists, the job that wrote them). Two jobs that read different
    bytes for the same range (the file changed in between) stop the store."""
    spans: dict[tuple, tuple] = {}
    for sums, job in found:
        for i, a, b, digest in sums:
            first = spans.setdefault((i, a, b), (digest, job))
            if first[0] != digest:
                raise ValueError(
                    f"data source {entries[i]['source']} bytes {a}..{b} read by tokenize jobs {first[1]} and {job} differ "
                    f"(sha256 {first[0]} vs {digest}): the file changed while it was tokenized; run get-data and tokenize again"
                )
    out: dict = {}
    for (i, a, b), (digest, _) in sorted(spans.items()):
        name = entries[i]["source"]
        if "ranges" in entries[i]:
            out.setdefault(name, []).append([a, b, digest])
        else:
            out[name] = digest
    return out or None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe token-store", description=__doc__)
    p.add_argument("--shards", nargs="+", required=True, help="token shards, or tokenize job folders of them, in order")
    p.add_argument("--sources", help="sources.json (its key goes into the fingerprint)")
    p.add_argument("--out", required=True, help="manifest.json to write (beside the shards)")
    args = p.parse_args(argv)
    key = mix = reads = sums = None
    try:
        if args.sources:
            sources = json.loads(Path(args.sources).read_text())
            jobs = job_reads([Path(p) for p in args.shards if Path(p).is_dir()])
            reads = source_reads(jobs, sources["sources"], sources.get("scanned", {}))
            sums = source_checksums(jobs, sources["sources"])
            key, mix = sources["key"], sources.get("mixture")
        build_manifest(shard_files(args.shards), args.out, key, mix, reads, sums)
    except ValueError as exc:  # a job folder without its read.json, a shard outside the store: one line
        raise SystemExit(f"llmpipe token-store: error: {exc}") from None
