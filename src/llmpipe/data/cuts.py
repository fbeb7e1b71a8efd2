"""Which sources get-data cuts into byte ranges (data.range_split_bytes), asked alike by get-data, a mixture's
count and the DAG's tokenize grouping; where the cuts fall is readers.jsonl.split_points."""

from __future__ import annotations

import os

from llmpipe.data.readers import HF_PREFIX, JSONL_SUFFIXES, _compression
from llmpipe.data.readers.jsonl import cuttable, has_record, split_points
from llmpipe.data.sources import RECORD_BITS

__all__ = ["cut_files", "cuttable", "has_record", "split_points", "splits"]


def splits(data_cfg: dict, sources: list[str], bad: dict) -> list[str]:
    """The sources to cut into byte ranges: local plain JSONL files of at least data.range_split_bytes (and
    under 2**RECORD_BITS bytes: offsets are document ids), when there are fewer sources than shards (record-level
    deal) and no data.max_records_per_source (a count of records from the file's start). Smaller files keep
    the record index modulo num_shards deal, so their stores stay as they were (docs/data.md, Sharding)."""
    least, n = data_cfg.get("range_split_bytes"), data_cfg["num_shards"]
    if least is None or len(sources) >= n or n < 2 or data_cfg.get("max_records_per_source") is not None:
        return []
    out = []
    for s in sources:
        if s in bad or s.startswith(HF_PREFIX) or "://" in s and not s.startswith("file://") or _compression(s):
            continue
        path = s.removeprefix("file://")
        if s.lower().endswith(JSONL_SUFFIXES) and os.path.isfile(path) and least <= os.path.getsize(path) < 1 << RECORD_BITS:
            out.append(s)
    return out


def cut_files(data_cfg: dict, sources: list[str], bad: dict) -> list[str]:
    """The sources get-data cuts into byte ranges: splits() that hold a line not blank (a blank file is left
    whole, so its readers name it empty) and do not start as an array (cuttable). The DAG (tokenize grouping)
    and a mixture's count ask this too."""
    return [s for s in splits(data_cfg, sources, bad) if cuttable(has_record(s)[0])]
