"""Data mixtures: several sources with weights (as SlimPajama's seven sources or Levanter mixtures),
sampled deterministically into the token store.

`data.sources` items may be {path, weight, name}; plain strings weigh 1 and name themselves. A weight
is the group's target share of the stored text. get_data counts each group's usable documents and
UTF-8 bytes (one read under the same bad-record policy) and gives group g the sampling rate

    rate_g = (w_g / W) * T / bytes_g,   T = min_g(bytes_g * W / w_g),   W = sum of the weights,

so the scarcest group (relative to its weight) is kept whole and no document repeats. The others keep
their documents in the order of a seeded hash of (source, record) until their byte quota is met: the
group's `rate` is the hash threshold, and a document is kept when its hash falls below it, the same
documents for any shard count or reading order. Shares hold in bytes to within one document and in
tokens as far as the groups' bytes per token agree; the manifest records the real per-source and
per-group token counts (`by_source`, `by_group`), read back from the stored document offsets.
"""

from __future__ import annotations

import hashlib
import logging

from llmpipe.data.sources import RECORD_BITS, paths  # noqa: F401 (paths: mixture.paths for callers)


def is_mixture(sources: list) -> bool:
    return any(isinstance(s, dict) for s in sources)


def groups(sources: list) -> list[dict]:
    """One group per data.sources item: name, weight, path."""
    out, seen = [], set()
    for i, s in enumerate(sources):
        s = s if isinstance(s, dict) else {"path": s, "weight": 1.0}
        name = s.get("name") or f"source{i}"
        if name in seen:
            raise ValueError(f"data.sources: mixture name {name!r} used twice")
        seen.add(name)
        out.append({"name": name, "weight": float(s["weight"]), "path": s["path"]})
    return out


def plan(data_cfg: dict, workers: int = 1) -> tuple[list[str], dict]:
    """(expanded sources, mixture plan) for data.sources with weights: reads every group once, its files
    counted by `workers` processes at once (the plan is the same for any number)."""
    import numpy as np  # here: get-data without a mixture starts faster

    from llmpipe.data.sources import expand_sources

    gs, expanded, group_of, mix_seed = groups(data_cfg["sources"]), [], [], data_cfg["split_seed"]
    for g_idx, g in enumerate(gs):
        files = expand_sources([g["path"]])
        expanded += files
        group_of += [g_idx] * len(files)
    from llmpipe.data.cuts import cut_files

    cut = set(cut_files(data_cfg, expanded, {}))  # their documents are identified (and sampled) by byte offset
    counted = _count_all(data_cfg, expanded, workers, cut)
    for g_idx, g in enumerate(gs):
        mine = [c for c, of in zip(counted, group_of) if of == g_idx]
        g.update(documents=sum(c[2] for c in mine), bytes=sum(c[3] for c in mine))
        g["_docs"] = (np.concatenate([c[0] for c in mine]), np.concatenate([c[1] for c in mine]))
        if not g["bytes"]:
            raise ValueError(f"data.sources: mixture group {g['name']!r} ({g['path']}) has no usable documents")
    total_w = sum(g["weight"] for g in gs)
    target = min(g["bytes"] * total_w / g["weight"] for g in gs)
    for g in gs:
        hashes, sizes = g.pop("_docs")
        quota = g["weight"] / total_w * target
        if quota >= g["bytes"] * (1 - 1e-12):  # the scarcest group (quota == bytes up to rounding)
            g["rate"], g["bytes_kept"] = 1.0, g["bytes"]
            continue
        # The documents in hash order up to the group's byte quota: the threshold is the hash just past them,
        # so a group's kept bytes equal its quota to within one document.
        order = np.argsort(hashes, kind="stable")
        cum = np.cumsum(sizes[order])
        k = int(np.searchsorted(cum, quota, side="right"))
        if k == 0:  # its quota is under its first document's size: the group would train on nothing
            scarce = min(gs, key=lambda o: o["bytes"] * total_w / o["weight"])
            raise ValueError(
                f"data.sources: mixture group {g['name']!r} would keep no document: its share ({int(quota)} bytes, "
                f"weight {g['weight']} against group {scarce['name']!r}'s {scarce['bytes']} bytes at weight "
                f"{scarce['weight']}) is smaller than its first document in sampling order ({int(sizes[order[0]])} "
                f"bytes); give group {scarce['name']!r} more data or weight"
            )
        g["rate"] = float(hashes[order[k]]) if k < len(order) else 1.0
        g["bytes_kept"] = int(cum[k - 1])
    return expanded, {"groups": gs, "group_of_source": group_of, "seed": mix_seed}


def _count_all(data_cfg: dict, files: list[str], workers: int, cut: set = frozenset()) -> list[tuple]:
    """_count of every file, in file order (`cut`: those get-data will cut into byte ranges); `workers` > 1:
    that many processes at once (the first failing file's error is raised, as one process reading them in turn
    would)."""
    jobs = [(data_cfg, i, f, f in cut) for i, f in enumerate(files)]
    workers = min(workers, len(files))
    if workers < 2:
        return [_count(*job) for job in jobs]
    from concurrent.futures import ProcessPoolExecutor

    handler = logging.root.handlers[0] if logging.root.handlers else None
    fmt = handler.formatter._fmt if handler and handler.formatter else None
    pool = ProcessPoolExecutor(workers, initializer=_worker_logging, initargs=(logging.root.level, fmt))
    try:
        futures = [pool.submit(_count, *job) for job in jobs]
        return [f.result() for f in futures]
    finally:
        pool.shutdown(cancel_futures=True)


def _worker_logging(level: int, fmt: str | None) -> None:
    """A counting process logs (bad records skipped, long lines) as the get-data process does."""
    if not logging.root.handlers:
        logging.basicConfig(level=level, format=fmt)


def _count(data_cfg: dict, source_index: int, source: str, cut: bool = False) -> tuple:
    """(hash of each usable document, its UTF-8 bytes, documents, bytes) of one source; `cut`: a file get-data
    cuts into byte ranges, read as one range so each document's identity is its byte offset, as tokenize's."""
    import os

    import numpy as np

    from llmpipe.data.readers import ReadStats, documents
    from llmpipe.data.sources import ByteRange

    stats, hashes, sizes, seed = ReadStats(), [], [], data_cfg["split_seed"]
    counted, part = 0, None
    if cut:
        size = os.path.getsize(source.removeprefix("file://"))
        part = ByteRange(0, size, size)
    for r_idx, _ in documents(source, data_cfg, stats, part=part):  # documents() adds each one's UTF-8 bytes to stats
        hashes.append(_hash(seed, source_index, r_idx))
        sizes.append(stats.bytes - counted)
        counted = stats.bytes
    return np.array(hashes, dtype=np.float64), np.array(sizes, dtype=np.int64), stats.documents, stats.bytes


def _hash(seed: int, source_index: int, record_index: int) -> float:
    """Seeded hash of a document's identity in [0, 1)."""
    digest = hashlib.blake2b(f"mix:{seed}:{source_index}:{record_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


def selected(mix: dict, source_index: int, record_index: int) -> bool:
    rate = mix["groups"][mix["group_of_source"][source_index]]["rate"]
    return rate >= 1.0 or _hash(mix["seed"], source_index, record_index) < rate


def keeper(mix: dict | None, source_index: int, keep):
    """`keep` (a shard's record filter) narrowed to the mixture's sample of one source."""
    if not mix:
        return keep
    return lambda r: keep(r) and selected(mix, source_index, r)


def source_counts(shard, splits) -> dict:
    """{source index: {split: {documents, tokens}}} of one open token shard, from its offsets and doc ids."""
    return counts_of({split: (shard.get_tensor(f"{split}.offsets"), shard.get_tensor(f"{split}.doc_ids")) for split in splits})


def counts_of(arrays: dict) -> dict:
    """{source index: {split: {documents, tokens}}} of {split: (offsets, doc_ids)}."""
    import numpy as np

    out: dict[str, dict] = {}
    splits = list(arrays)
    for split, (offs, ids) in arrays.items():
        src = (ids >> RECORD_BITS).astype(np.int64)
        lengths = np.diff(offs)
        for s in np.unique(src):
            mask = src == s
            entry = out.setdefault(str(int(s)), {sp: {"documents": 0, "tokens": 0} for sp in splits})
            entry[split] = {"documents": int(mask.sum()), "tokens": int(lengths[mask].sum())}
    return out


def add_counts(total: dict, part: dict) -> None:
    for s, splits in part.items():
        entry = total.setdefault(s, {sp: {"documents": 0, "tokens": 0} for sp in splits})
        for sp, c in splits.items():
            entry[sp]["documents"] += c["documents"]
            entry[sp]["tokens"] += c["tokens"]


def group_counts(by_source: dict, mix: dict) -> dict:
    """Per mixture group: tokens per split, share of the train tokens, target share."""
    total_w = sum(g["weight"] for g in mix["groups"])
    out = {g["name"]: {"train_tokens": 0, "val_tokens": 0, "target_share": g["weight"] / total_w} for g in mix["groups"]}
    for s, c in by_source.items():
        g = out[mix["groups"][mix["group_of_source"][int(s)]]["name"]]
        g["train_tokens"] += c["train"]["tokens"]
        g["val_tokens"] += c["val"]["tokens"]
    train = sum(g["train_tokens"] for g in out.values()) or 1
    for g in out.values():
        g["share"] = g["train_tokens"] / train
    return out
