"""Sources: expand braces and globs (local or fsspec URLs), fingerprint them, and assign them to shards.

Sharding is deterministic: with at least as many sources as shards, whole sources go round-robin to
shards; otherwise every shard reads every source and keeps the records whose index is its own
modulo the shard count, except a large plain JSONL file that get_data split into one byte range per
shard (data.range_split_bytes): each shard reads only its range. A document is identified by (source
index, record index), or in a file cut into byte ranges by (source index, byte offset of its line), whatever
the shard count or the deal, so the validation split never depends on them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass

from braceexpand import braceexpand

HF_PREFIX = "hf:"  # a Hugging Face dataset (hf:<repo or saved folder>), read by readers._hf
RECORD_BITS = 40  # doc id = source index << RECORD_BITS | record index


def paths(sources: list) -> list[str]:
    """The source strings of data.sources (weighted items give their path)."""
    return [s["path"] if isinstance(s, dict) else s for s in sources]


def doc_id(source_index: int, record_index: int) -> int:
    return (source_index << RECORD_BITS) | record_index


def is_validation(source_index: int, record_index: int, fraction: float, seed: int) -> bool:
    """Seeded hash of the document identity: stable for any shard count or reading order."""
    digest = hashlib.blake2b(f"{seed}:{source_index}:{record_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < fraction


def _glob(pattern: str) -> list[str]:
    import fsspec

    fs, path = fsspec.core.url_to_fs(pattern)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    local = protocol in ("file", "local")
    if any(c in path for c in "*?[") and not (local and fs.isfile(path)):  # a file named `a [1].jsonl` is itself
        found = sorted(m for m in fs.glob(path) if not _hidden(m, path))
    else:
        found = [path] if fs.exists(path) else []
    if not local:
        found = [fs.unstrip_protocol(p) for p in found]
    elif not pattern.startswith("file://"):
        found = [os.path.relpath(p) if not os.path.isabs(pattern) else p for p in found]
    return found


def _hidden(match: str, pattern: str) -> bool:
    """A match whose name (or a folder of it) begins with `.` where the pattern's glob matched it: hidden files
    such as macOS's `._x.jsonl` are left out, as the shell and Python's glob leave them (fsspec's `*` takes
    them); a pattern naming the dot itself (`data/.cache/*.jsonl`, `.*.jsonl`) keeps them."""
    glob_at = min(pattern.find(c) for c in "*?[" if c in pattern)
    base = pattern[: pattern.rfind("/", 0, glob_at) + 1]
    if not match.startswith(base):
        return False
    asked = pattern[len(base) :].split("/")
    return any(
        part.startswith(".") and part not in (".", "..") and part not in asked and not any(a.startswith(".") for a in asked)
        for part in match[len(base) :].split("/")
    )


def expand_sources(sources: list[str]) -> list[str]:
    """Brace-expand (train.{1..32}.jsonl.gz), then glob; HF ids pass through. A pattern matching nothing is an error."""
    out: list[str] = []
    for src in sources:
        if src.startswith(HF_PREFIX):
            out.append(src)
            continue
        for pattern in braceexpand(src):
            matches = _glob(pattern)
            if not matches:
                raise FileNotFoundError(f"data source not found: {pattern}")
            out.extend(matches)
    return out


def same_file(source: str) -> str:
    """What a source is, whatever its spelling: a local file's real path (file:// URL, relative, `..`,
    symlink), a local hf: folder's real path, else the name as given (a remote URL, a Hub dataset)."""
    if source.startswith(HF_PREFIX):
        folder = source[len(HF_PREFIX) :]
        return HF_PREFIX + os.path.realpath(folder) if os.path.isdir(folder) else source
    if "://" in source and not source.startswith("file://"):
        return source
    return os.path.realpath(source.removeprefix("file://"))


def _local_files(path: str) -> list[str]:
    """The files a local source reads: itself, or every file under a local hf: folder."""
    if not path.startswith(HF_PREFIX):
        return [path]
    if not os.path.isdir(folder := path[len(HF_PREFIX) :]):
        return []  # a Hub dataset
    return [os.path.join(d, f) for d, _, names in os.walk(folder) for f in names]


def refuse_repeats(sources: list[str]) -> None:
    """A file listed twice (a glob and its own name, two spellings of one path, two hard links to it) would be
    read twice: every document trained on twice and, its copies split apart, in both train and val. Refused,
    naming both."""
    seen: dict[object, int] = {}  # file (real path; device and inode) -> position of its first spelling
    for i, s in enumerate(sources):
        path = same_file(s)
        keys: list[object] = [path]
        if "://" not in s or s.startswith("file://"):  # local: its inodes too (hard links; a file inside an hf: folder)
            for name in _local_files(path):
                with contextlib.suppress(OSError):
                    st = os.stat(name)
                    keys.append((st.st_dev, st.st_ino))
        for key in dict.fromkeys(keys):
            first = sources[seen.setdefault(key, i)]
            if seen[key] != i:
                pair = f"{same_file(first)} and {path}"
                inside = first.startswith(HF_PREFIX) or s.startswith(HF_PREFIX)
                how = (
                    "" if key == path else f" (one file read by both: {pair})" if inside else f" (hard links to one file: {pair})"
                )
                raise ValueError(
                    f"data.sources names {path} twice ({first!r} and {s!r}){how}: its documents would be read twice "
                    "and could land in both train and val; list each file once"
                )


@dataclass(frozen=True)
class ByteRange:
    """One shard's part of a plain JSONL source that get_data cut at line starts: bytes [start, end); its
    records are identified by their lines' byte offsets. `size`: the file's size when cut (a guard)."""

    start: int
    end: int
    size: int


class Source(str):
    """A source's name (a str: equal to it, hashed, printed and serialised as it) that may carry, for a file
    get_data split into byte ranges, `ranges`: the byte offset where each shard's range starts, then the
    file's size, and `size` (sources.json; get_data.load_sources)."""

    ranges: tuple | None = None
    size: int | None = None


def split_source(name: str, ranges, size: int) -> Source:
    out = Source(name)
    out.ranges, out.size = tuple(ranges), size
    return out


@dataclass(frozen=True)
class Assignment:
    """What one shard reads: (source index, source, keep record i?) triples; `ranges`: (source index,
    ByteRange) of the sources it reads by byte range (all their records in it kept)."""

    shard: int
    num_shards: int
    sources: tuple[tuple[int, str], ...]
    record_level: bool
    ranges: tuple[tuple[int, ByteRange], ...] = ()

    def keep(self, record_index: int) -> bool:
        return not self.record_level or record_index % self.num_shards == self.shard

    def reading(self, source_index: int) -> tuple:
        """(keep, stride, byte range) to pass to readers.documents for one of the shard's sources."""
        part = dict(self.ranges).get(source_index)
        if part is not None:
            return _keep_all, None, part
        return self.keep, ((self.shard, self.num_shards) if self.record_level else None), None


def _keep_all(record_index: int) -> bool:
    return True


def assign(sources: list[str], num_shards: int, shard: int) -> Assignment:
    """Sources carrying byte ranges (Source.ranges, one per shard) are read by range in a record-level deal."""
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} outside 0..{num_shards - 1}")
    indexed = list(enumerate(sources))
    if len(sources) >= num_shards:
        return Assignment(shard, num_shards, tuple(s for s in indexed if s[0] % num_shards == shard), False)
    ranges = []
    for i, source in indexed:
        cuts = getattr(source, "ranges", None)
        if cuts is None:
            continue
        if not isinstance(cuts[0], int):  # [offset, first record, first line]: cut by an llmpipe before 2026-11-30
            raise ValueError(
                f"sources.json numbers the records of {source} by index, as llmpipe did before 2026-11-30; its byte "
                "ranges now identify them by byte offset: run get-data again (snakemake --forcerun get_data)"
            )
        if len(cuts) != num_shards + 1:
            raise ValueError(
                f"data source {source} was split into {len(cuts) - 1} byte ranges, not data.num_shards {num_shards}: "
                "run get-data again"
            )
        ranges.append((i, ByteRange(cuts[shard], cuts[shard + 1], source.size)))
    return Assignment(shard, num_shards, tuple(indexed), True, tuple(ranges))


def local_stat(path: str) -> list[int]:
    """What changes whenever a local file's bytes may have: size, mtime_ns, ctime_ns (which no user can set
    back, unlike mtime: `cp -p`, `rsync -t`, `touch -d`), inode (a file replaced by `mv`)."""
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def stat_digest(paths: list[str]) -> str:
    """One cheap fingerprint of local files (the DAG is keyed by it: a change reruns get_data)."""
    h = hashlib.sha256()
    for path in paths:
        h.update(f"{path}\0{local_stat(path)}\n".encode())
    return h.hexdigest()


def describe(source: str) -> dict:
    """Identity of a source for keying outputs: its size (local files; their sha256 is taken by the tokenize
    jobs as they read them, with no read of its own), size + etag/mtime for remote ones."""
    if source.startswith(HF_PREFIX):
        return {"source": source}
    if "://" not in source:
        return {"source": source, "size": os.path.getsize(source)}
    import fsspec

    fs, path = fsspec.core.url_to_fs(source)
    info = fs.info(path)
    entry = {"source": source, "size": info.get("size")}
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol not in ("file", "local"):
        for key in ("ETag", "etag", "LastModified", "mtime", "last_modified", "Last-Modified", "Content-MD5", "Digest"):
            if key in info:
                entry[key.lower()] = str(info[key])
    return entry
