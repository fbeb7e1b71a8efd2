"""One long document through `tokenize_shard` (the tokenize job's code path): peak RSS and throughput.

  python benchmarks/long_document.py [--sizes 20 200 1000] [--backend tiktoken hf] [--kind jsonl txt] [--baseline]

Each size (MB of text) is the shipped sample corpus joined into one line, repeated, written as one JSONL
record (its text a JSON string with escapes: quotes, backslashes, emoji as surrogate pair escapes) or as a text file
(data.text_mode: file, the whole file one document) in a temporary folder; records over
readers.HUGE_RECORD_BYTES (16 MiB) are read and tokenized as streams (issue G7); a fresh process tokenizes it (GPT-2, one thread) and reports its own peak
RSS (ru_maxrss), wall time, MB/s and tokens/s. `--baseline` also runs each size with piecewise encoding
off (the whole document in one tokenizer call, as before): only sensible for small sizes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "data" / "gutenberg-sample-2mb.jsonl.gz"
GPT2 = REPO / "data" / "tokenizers" / "gpt2"


def write_document(path: Path, mb: int) -> int:
    """One JSONL record (or text file, by `path`'s suffix) of `mb` MB of text (the corpus as one line,
    repeated); returns the file's size."""
    with gzip.open(CORPUS, "rt", encoding="utf-8") as fh:
        text = " ".join(json.loads(line)["text"].replace("\r", " ").replace("\n", " ") for line in fh) + ' "q" \\ 😀 '
    target, written = mb * 10**6, 0
    jsonl = path.suffix == ".jsonl"
    with open(path, "w", encoding="utf-8") as out:
        if jsonl:
            out.write('{"id": 1, "meta": {"text": "not this"}, "text": "')
        while written < target:
            chunk = text[: target - written] if written + len(text.encode()) > target else text
            out.write(json.dumps(chunk)[1:-1] if jsonl else chunk)  # ensure_ascii: emoji as surrogate pair escapes
            written += len(chunk.encode())
        if jsonl:
            out.write('"}\n')
    return path.stat().st_size


def worker(doc: str, backend: str, out: str, baseline: bool) -> None:
    import resource

    from llmpipe import config as cfgmod
    from llmpipe.data import long_docs
    from llmpipe.data.tokenize import tokenize_shard

    if baseline:
        long_docs.LONG_DOC_CHARS = 1 << 62
    cfg = cfgmod.validate(
        {
            "run": "bench",
            "results_dir": str(Path(out).parent / "results"),
            "data": {"sources": [doc], "num_shards": 1, "val_fraction": 0.01, "text_mode": "file"},
            "tokenizer": {"source": str(GPT2), "backend": backend},
        },
        whole=False,
    )
    start = time.perf_counter()
    counts = tokenize_shard(cfg, [doc], 0, GPT2, out, 1)
    wall = time.perf_counter() - start
    tokens = sum(c["tokens"] for c in counts.values())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"wall_s": wall, "tokens": tokens, "peak_rss": peak}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[20, 200, 1000], help="document sizes, MB")
    p.add_argument("--backend", nargs="+", default=["tiktoken", "hf"])
    p.add_argument("--kind", nargs="+", default=["jsonl", "txt"], help="source formats")
    p.add_argument("--baseline", action="store_true", help="also run with piecewise encoding off")
    p.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        doc, backend, out, baseline = args.worker
        worker(doc, backend, out, baseline == "1")
        return
    print(
        f"{'size':>7} {'kind':>5} {'backend':>9} {'mode':>9} {'wall s':>8} {'MB/s':>7} {'Mtok/s':>7} {'tokens':>12} {'peak RSS':>9}"
    )
    for mb in args.sizes:
        for kind in args.kind:
            with tempfile.TemporaryDirectory() as tmp:
                doc = Path(tmp) / f"doc-{mb}mb.{kind}"
                size = write_document(doc, mb)
                run_size(args, mb, kind, tmp, doc, size)


def run_size(args, mb: int, kind: str, tmp: str, doc: Path, size: int) -> None:
    for backend in args.backend:
        for baseline in [False, True] if args.baseline else [False]:
            out = Path(tmp) / f"shard-{backend}-{int(baseline)}.safetensors"
            cmd = [sys.executable, __file__, "--worker", str(doc), backend, str(out), "1" if baseline else "0"]
            run = subprocess.run(cmd, capture_output=True, text=True)
            mode = "whole" if baseline else "piecewise"
            if run.returncode != 0:
                tail = run.stderr.strip().splitlines()[-1:] or [f"exit {run.returncode}"]
                print(f"{mb:>5}MB {kind:>5} {backend:>9} {mode:>9} failed (exit {run.returncode}): {tail[0][:200]}")
                continue
            r = json.loads(run.stdout.strip().splitlines()[-1])
            print(
                f"{mb:>5}MB {kind:>5} {backend:>9} {mode:>9} {r['wall_s']:>8.1f} {size / 1e6 / r['wall_s']:>7.2f} "
                f"{r['tokens'] / 1e6 / r['wall_s']:>7.2f} {r['tokens']:>12,} {r['peak_rss'] / 2**30:>8.2f}G",
                flush=True,
            )
            out.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
