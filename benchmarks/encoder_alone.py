"""The encoder alone, the baseline of the data benchmarks, 1 thread a process, text already in memory:
tiktoken's encode_ordinary per document (its API for plain text), tiktoken's one call per batch of
documents joined by <|endoftext|> (`tiktoken-joined`: the call our tiktoken path makes, the stricter
baseline), or HF's encode_batch_fast (the call our HF path makes)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from peak import children_cpu  # benchmarks/peak.py

GPT2 = Path(__file__).resolve().parents[1] / "data" / "tokenizers" / "gpt2"
BATCH = 256  # texts per encoder call where the call takes a batch (HF), as our HF path batches


def corpus_texts(corpus: str) -> list[str]:
    import gzip

    import orjson

    with gzip.open(corpus, "rb") as fh:
        return [orjson.loads(line)["text"] for line in fh]


def encoder(which: str):
    """The encoder alone (`which`: see the module), 1 thread, as a call from texts to their id lists, over
    GPT-2 (tiktoken's ranks built as llmpipe builds them). Lazy: each id list is made when it is taken
    and freed once used, as a raw encode is."""
    if which.startswith("tiktoken"):
        from llmpipe.data.encoders import _tiktoken_core
        from llmpipe.data.tokenizer import _file_key

        enc = _tiktoken_core(_file_key(GPT2))[0]
        if which == "tiktoken-joined":  # one array per batch; the slice leaves out one token per document (its EOS)
            eos = "<|endoftext|>"
            return lambda texts: [enc.encode_to_numpy(eos.join(texts) + eos, allowed_special="all")[len(texts) :]]
        return lambda texts: (enc.encode_ordinary(t) for t in texts)
    os.environ["RAYON_NUM_THREADS"] = "1"
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(GPT2 / "tokenizer.json"))
    return lambda texts: (e.ids for e in tok.encode_batch_fast(texts, add_special_tokens=False))


def count(which: str, texts: list[str]) -> int:
    """Tokens of the texts by the encoder alone, in batches of BATCH."""
    encode = encoder(which)
    return sum(len(ids) for i in range(0, len(texts), BATCH) for ids in encode(texts[i : i + BATCH]))


def two_processes(texts: list[str], count, copies: int = 1) -> tuple[float, int, float]:
    """(wall s, tokens, CPU s) of count(half the texts), `copies` times, in each of 2 forked processes, text
    already in memory."""
    before = children_cpu()
    start, children = time.perf_counter(), []
    for part in range(2):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, str(sum(count(texts[part::2]) for _ in range(copies))).encode())
            os._exit(0)
        os.close(write)
        children.append((pid, read))
    tokens = 0
    for pid, read in children:
        tokens += int(os.read(read, 64))
        os.waitpid(pid, 0)
    return time.perf_counter() - start, tokens, children_cpu() - before
