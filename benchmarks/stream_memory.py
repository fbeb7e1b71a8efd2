"""Peak RSS of reading one source through `readers.documents` at 1x and 10x its size, per input kind.

  python benchmarks/stream_memory.py [--mb 30] [--kinds paragraph parquet ...] [--keep DIR]
      [--corpus ../shared/data/corpus/gutenberg-chunks-100mb.jsonl.gz]

Inputs are real text: the Gutenberg chunks corpus (~4 KB documents, ../shared/data/SOURCES.md), cycled
with a pass number in front of each document to reach the size (1x = --mb MB of text, 10x = ten times):
  jsonl, jsonl.gz   one record per line (references: streamed line by line since before)
  jsonl.zst         the same, zstd (compression.zstd / backports.zstd, pieces of at most 1 MiB)
  paragraph         a .txt file, text_mode: paragraph: documents joined by blank lines, and per 30 MB one
                    20 MB paragraph (single newlines only; comes as a StreamedText)
  parquet           a .parquet file written 2,000 rows per row group (~9 MB), read by _parquet
  hf-parquet        the same file as `hf:<folder>/train.parquet` (data files; streaming: true)
  hf-saved          the same rows as `hf:<folder>` written by datasets' save_to_disk
  hf-jsonl          the jsonl file as `hf:<folder>/train.jsonl` (datasets' own streaming JSON reader)
  strided           a plain .jsonl with one 20 MB record per 30 MB, read as shard 0 of 4 (the strided scan:
                    it keeps every other long record, as a StreamedText, and skips the others)
Each input is written by a child process, then read by a fresh one (streamed=True, as tokenize reads: a
StreamedText is read through its chunks) whose peak RSS is its own ru_maxrss (peak.run_alone). Prints the
peak at 1x and 10x and the ratio (target: within 1.10).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from peak import run_alone  # benchmarks/peak.py

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "data" / "corpus" / "gutenberg-chunks-100mb.jsonl.gz"
KINDS = ["jsonl", "jsonl.gz", "jsonl.zst", "paragraph", "parquet", "hf-parquet", "hf-saved", "hf-jsonl", "strided"]
HUGE = 20 * 10**6  # characters of a long paragraph / record: over readers.HUGE_RECORD_BYTES (16 MiB) + a read
UNIT = 30 * 10**6  # text per long one
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src")}


def texts(mb: float = float("inf")):
    """Documents of the corpus, cycled with the pass number in front, until `mb` MB of text."""
    left = mb * 10**6
    for n in itertools.count():
        with gzip.open(CORPUS, "rt", encoding="utf-8") as fh:
            for line in fh:
                text = f"[{n}] " + json.loads(line)["text"]
                yield text
                left -= len(text)
                if left <= 0:
                    return


def with_long(mb: int):
    """(text, long?) of about `mb` MB: per UNIT, documents, then one text of HUGE characters (documents joined
    by single newlines), record 4k in even units, 4k + 2 in odd ones (shard 0 of 4 keeps every other one)."""
    docs, count = texts(), 0
    for unit in range(max(1, round(mb * 10**6 / UNIT))):
        n = 0
        while n < UNIT - HUGE or count % 4 != 2 * (unit % 2):
            text = next(docs)
            yield text, False
            n, count = n + len(text), count + 1
        long = []
        while sum(map(len, long)) < HUGE:
            long.append(re.sub(r"[\r\n]+", "\n", next(docs).strip()))
        yield "\n".join(long)[:HUGE], True
        count += 1


def make(kind: str, mb: int, out: Path) -> str:
    """Write the input of `kind` under `out`; returns the source to read."""
    if kind in ("jsonl", "jsonl.gz", "jsonl.zst", "hf-jsonl"):
        import zstandard  # the test extra's: another zstd library than the one reading

        path = out / ("train.jsonl" if kind == "hf-jsonl" else f"corpus.{kind}")
        opener = {"jsonl.gz": gzip.open, "jsonl.zst": zstandard.open}.get(kind, open)
        with opener(path, "wt", encoding="utf-8") as fh:
            for text in texts(mb):
                fh.write(json.dumps({"text": text}) + "\n")
        return f"hf:{out}" if kind == "hf-jsonl" else str(path)
    if kind == "paragraph":
        path = out / "corpus.txt"
        with open(path, "w", encoding="utf-8") as fh:
            for text, _ in with_long(mb):
                fh.write(text + "\n\n")
        return str(path)
    if kind == "strided":
        path = out / "corpus.jsonl"
        with open(path, "w", encoding="utf-8") as fh:
            for text, _ in with_long(mb):
                fh.write(json.dumps({"text": text}) + "\n")
        return str(path)
    return make_arrow(kind, mb, out)


def make_arrow(kind: str, mb: int, out: Path) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = texts(mb)
    tables = (pa.table({"text": batch}) for batch in iter(lambda: list(itertools.islice(docs, 2_000)), []))
    if kind == "hf-saved":
        import datasets

        datasets.Dataset(pa.concat_tables(list(tables))).save_to_disk(str(out))
        return f"hf:{out}"
    path = out / ("train.parquet" if kind == "hf-parquet" else "corpus.parquet")
    with pq.ParquetWriter(path, pa.schema({"text": pa.string()})) as writer:
        for table in tables:
            writer.write_table(table)
    return f"hf:{out}" if kind == "hf-parquet" else str(path)


def read(source: str, kind: str) -> None:
    """Every document of `source` through readers.documents, as a tokenize job reads it."""
    from llmpipe import config as cfgmod
    from llmpipe.data import readers

    data = {"sources": [source], "text_mode": "paragraph"}
    cfg = cfgmod.load({"data": data})["data"]
    stats, streamed, chars = readers.ReadStats(), 0, 0
    keep, stride = (lambda i: i % 4 == 0, (0, 4)) if kind == "strided" else (lambda i: True, None)
    start = time.perf_counter()
    for _, text in readers.documents(source, cfg, stats, keep, stride, streamed=True):
        if isinstance(text, readers.StreamedText):
            streamed += 1
            chars += sum(len(piece) for piece in text.chunks())
        else:
            chars += len(text)
    wall = time.perf_counter() - start
    print(json.dumps({"documents": stats.documents, "streamed": streamed, "chars": chars, "wall_s": wall}))


def main() -> None:
    global CORPUS  # the children get it by --corpus
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=int, default=30, help="1x size, MB of text")
    p.add_argument("--kinds", nargs="+", default=KINDS, choices=KINDS)
    p.add_argument("--keep", help="write the inputs here and keep them")
    p.add_argument("--corpus", type=Path, default=CORPUS, help="the chunks corpus (JSONL .gz)")
    p.add_argument("--make", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--read", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    CORPUS = args.corpus
    if args.make:
        print(make(args.make[0], int(args.make[1]), Path(args.make[2])))
        return
    if args.read:
        read(*args.read)
        return
    root = Path(args.keep or tempfile.mkdtemp(prefix="stream-memory-"))
    print(
        f"{'kind':>10} {'1x MB':>6} {'1x peak':>8} {'10x peak':>9} {'ratio':>6} {'10x docs':>9} {'streamed':>8} {'10x read s':>10}"
    )
    try:
        for kind in args.kinds:
            peaks, runs = [], []
            for mb in (args.mb, 10 * args.mb):
                out = root / f"{kind}-{mb}"
                out.mkdir(parents=True, exist_ok=True)
                _, _, made = run_alone(
                    [sys.executable, __file__, "--make", kind, str(mb), str(out), "--corpus", str(CORPUS)], env=ENV
                )
                _, peak, said = run_alone([sys.executable, __file__, "--read", made.strip().splitlines()[-1], kind], env=ENV)
                peaks.append(peak)
                runs.append(json.loads(said.strip().splitlines()[-1]))
                if not args.keep:
                    shutil.rmtree(out)
            r = runs[1]
            print(
                f"{kind:>10} {args.mb:>6} {peaks[0] / 2**20:>7.0f}M {peaks[1] / 2**20:>8.0f}M {peaks[1] / peaks[0]:>6.2f} "
                f"{r['documents']:>9,} {r['streamed']:>8} {r['wall_s']:>10.1f}",
                flush=True,
            )
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
