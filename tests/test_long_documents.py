"""Long documents are encoded in pieces cut where the pre-tokenizer itself cuts: the ids are those of
encoding the whole document at once, on both encoder paths, for GPT-2 and Llama-3; a pre-token too long
to encode goes under data.long_pretoken (split | skip), counted; a tokenizer failure names the document."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from llmpipe.data import long_docs
from llmpipe.data.encoders import HFEncoder, TiktokenEncoder
from llmpipe.data.long_docs import EncodeError
from llmpipe.data.tokenize import tokenize_shard
from tests.conftest import GPT2, SHARED_DATA, corpus_docs, prepare, tiny_config, write_jsonl

LLAMA3 = SHARED_DATA / "tokenizers" / "llama3"
PIECE = 4096  # small pieces: fast, and many cuts
TOKENIZERS = [
    pytest.param(GPT2, id="gpt2"),
    pytest.param(LLAMA3, id="llama3", marks=pytest.mark.skipif(not LLAMA3.is_dir(), reason="needs ../shared/data")),
]
_encoders: dict = {}


def encoders(folder):
    """(HF encoder, tiktoken encoder) of a tokenizer folder, set for small pieces and no pre-token limit."""
    if folder not in _encoders:
        hf = HFEncoder(folder, 1)
        _encoders[folder] = (hf, TiktokenEncoder(folder, 1, HFEncoder(folder, 1, hf.tok)))
    for enc in _encoders[folder]:
        enc.set_long(long_chars=PIECE, piece=PIECE, max_pretoken=1 << 30, policy="split")
        enc.stats.update(long_docs.stats_dict())
    return _encoders[folder]


def whole(hf, text):
    return hf.tok.encode(text, add_special_tokens=False).ids


def _mixed(seed: int, parts: list[str], n: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(parts) for _ in range(n))


def _digits_across_cuts() -> str:
    """Digit runs of length 3k, 3k+1, 3k+2 that cross PIECE-sized windows, with and without spaces before them."""
    out, rng = [], random.Random(3)
    while sum(map(len, out)) < 60_000:
        out.append(rng.choice(["x" * rng.randint(1, PIECE), " ", "日本", "\n", " " * rng.randint(1, 9)]))
        out.append("1234567890"[rng.randint(0, 9)] * (3 * rng.randint(1, 2000) + rng.randint(0, 2)))
    return "".join(out)


DOCUMENTS = {
    "one_endless_line": lambda: "".join(corpus_docs(400)).replace("\n", " ").replace("\r", " "),
    "only_digits": lambda: "31415926535897932384626433832795" * 3000 + "1",
    "only_newlines": lambda: "\n" * 50_000,
    "newlines_and_crlf": lambda: _mixed(1, ["\n", "\r\n", "\n\n", "\r"], 40_000),
    "long_space_runs": lambda: _mixed(2, ["word", " " * 3001, " " * 2999 + "\n", "\t" * 700, "x"], 200),
    "mixed_scripts": lambda: _mixed(
        4,
        ["Hello wörld ", "日本語のテキスト", "中文", "مرحبا بالعالم ", "😀👍🏽", "e\u0301\u0302 ", "ñ", "Ελληνικά ", "한국어"],
        20_000,
    ),
    "mixed_scripts_no_spaces": lambda: _mixed(5, ["日本語", "中文", "مرحبا", "😀👍🏽", "e\u0301", "Ω", "7", "42", "!?"], 40_000),
    "spaces_before_newlines": lambda: _mixed(6, ["a", " \n", "   \n", "\t\n", " \r\n", "  ", "\n \n", "b "], 40_000),
    "digit_runs_across_cuts": _digits_across_cuts,
    "contractions": lambda: _mixed(7, ["don't", " we'll", "'ll", "'LL", "''s", "'Ve", " it's", "'", "s", "x'", " '"], 30_000),
    "odd_whitespace": lambda: _mixed(8, ["\u00a0", "\u3000", "\x85", "\x1c", "\u2028", "\x0b", "a", " ", "\n", "1"], 40_000),
    "special_token_text": lambda: _mixed(9, ["hello ", "<|endoftext|>", "<|begin_of_text|>", " ", "<|", "x"], 20_000),
    # no single space to cut at (rule 3), whitespace runs of 2+ before text: such a run is one pre-token at a
    # piece's end ("\n\n" alone: 628) but two before a letter (198 198)
    "paragraphs_without_spaces": lambda: "\n\n".join("".join(random.Random(i).choices("abcxyz", k=50)) for i in range(2000)),
    # characters new in Unicode 17 (a Tolong Siki digit, a CJK Extension J ideograph): Python's `regex` module
    # knows them (\\p{N}, \\p{L}), the tokenizers do not: cuts must follow the tokenizer's own split
    "newer_unicode_than_the_tokenizers": lambda: _mixed(
        11, ["\U00011de0", "1234567890", "12", "日本語", "\U00031350", "。"], 20_000
    ),
    "runs_without_spaces": lambda: _mixed(
        10, ["abc", "日本語", "\n\n", "\n\n\n", "\t\t", "\r\n\r\n", "\u3000\u3000", "7"], 40_000
    ),
}


@pytest.mark.parametrize("path", ["hf", "tiktoken"])
@pytest.mark.parametrize("folder", TOKENIZERS)
@pytest.mark.parametrize("kind", sorted(DOCUMENTS))
def test_piecewise_ids_equal_whole_document_ids(folder, path, kind):
    hf, fast = encoders(folder)
    enc = hf if path == "hf" else fast
    text = DOCUMENTS[kind]()
    assert len(text) > 4 * PIECE
    got = enc.encode_batch(["short one", text, "another short one"])
    assert got[1] == whole(hf, text)
    assert got[0] == whole(hf, "short one") and got[2] == whole(hf, "another short one")
    assert enc.stats["long_documents"] == 1 and enc.stats["long_pretokens_split"] == 0
    streamed = enc.encode_batch([text], stream=True)[0]
    assert isinstance(streamed, long_docs.Pieces) and streamed.ids() == got[1]


@pytest.mark.parametrize("folder", TOKENIZERS)
def test_documents_are_cut_into_many_pieces(folder):
    hf, fast = encoders(folder)
    text = DOCUMENTS["one_endless_line"]()
    for enc in (hf, fast):
        enc.encode_batch([text])
        assert enc.stats["long_pieces"] > len(text) // (2 * PIECE)


@pytest.mark.parametrize("path", ["hf", "tiktoken"])
def test_pretoken_with_no_cut_point_under_split_and_skip(path):
    hf, fast = encoders(GPT2)
    enc = hf if path == "hf" else fast
    enc.set_long(long_chars=PIECE, piece=PIECE, max_pretoken=2 * PIECE, policy="split")
    endless = "an endless word: " + "a" * (5 * PIECE) + " then the end"
    spaces = "spaces: " + " " * (5 * PIECE) + "end"
    texts = ["short", endless, spaces]
    got = enc.encode_batch(texts)
    assert [hf.tok.decode(ids) for ids in got] == texts  # nothing lost: only cut
    assert got[0] == whole(hf, "short")
    assert enc.stats["long_documents"] == 2 and enc.stats["long_documents_skipped"] == 0
    assert enc.stats["long_pretokens_split"] == 2 + 2  # each run cut twice at 2 * PIECE

    enc.stats.update(long_docs.stats_dict())
    enc.set_long(policy="skip", long_chars=PIECE, piece=PIECE, max_pretoken=2 * PIECE)
    ok = DOCUMENTS["one_endless_line"]()[: 10 * PIECE]
    got = enc.encode_batch([endless, "short", spaces, ok])
    assert got[0] is None and got[2] is None
    assert got[1] == whole(hf, "short") and got[3] == whole(hf, ok)
    assert enc.stats["long_documents_skipped"] == 2 and enc.stats["long_documents"] == 1
    assert enc.stats["long_pretokens_split"] == 0
    with pytest.raises(ValueError, match="long_pretoken"):
        enc.set_long(policy="truncate")


def test_long_pretoken_within_the_limit_is_exact():
    hf, fast = encoders(GPT2)
    text = "word " + " " * (3 * PIECE) + "x" + "7" * (3 * PIECE)
    for enc in (hf, fast):
        enc.set_long(long_chars=PIECE, piece=PIECE, max_pretoken=8 * PIECE)
        assert enc.encode_batch([text])[0] == whole(hf, text)
        assert enc.stats["long_pretokens_split"] == 0


def test_unknown_pretokenizer_encodes_long_documents_whole():
    from tokenizers import Regex, Tokenizer, pre_tokenizers

    hf = HFEncoder(GPT2, 1, Tokenizer.from_file(str(GPT2 / "tokenizer.json")))  # its own copy: it is changed here
    hf.tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r"\w+|[^\w]"), "isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    hf.set_long(long_chars=PIECE, piece=PIECE)
    text = DOCUMENTS["one_endless_line"]()[: 10 * PIECE]
    assert hf.encode_batch([text])[0] == whole(hf, text)
    assert hf.stats["long_documents_whole"] == 1 and hf.stats["long_documents"] == 0


def shard_setup(tmp_path, docs, backend):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", docs)
    cfg = tiny_config(tmp_path, tokenizer={"source": str(GPT2), "backend": backend}, data={"num_shards": 1})
    return cfg, [str(corpus)]


@pytest.mark.parametrize("backend", ["hf", "tiktoken"])
def test_tokenize_shard_writes_long_documents_as_the_batch_path_does(tmp_path, monkeypatch, backend):
    long_doc = DOCUMENTS["one_endless_line"]()[: 40 * PIECE]
    docs = corpus_docs(6) + [long_doc] + corpus_docs(12)[6:] + [long_doc[::-1], "last"]
    cfg, sources = shard_setup(tmp_path, docs, backend)
    tokenize_shard(cfg, sources, 0, GPT2, tmp_path / "batch.safetensors")
    monkeypatch.setattr(long_docs, "LONG_DOC_CHARS", PIECE)
    monkeypatch.setattr(long_docs, "PIECE_CHARS", PIECE)
    streamed = []
    write = long_docs.write_pieces
    monkeypatch.setattr(long_docs, "write_pieces", lambda w, did, *a: streamed.append(did) or write(w, did, *a))
    tokenize_shard(cfg, sources, 0, GPT2, tmp_path / "pieces.safetensors")
    assert {6, 13} <= set(streamed)  # the two long documents (doc id = record index in source 0) went piecewise
    (pt, pm), (bt, bm) = (shard_contents(tmp_path / f"{n}.safetensors") for n in ("pieces", "batch"))
    assert pt.keys() == bt.keys() and all(np.array_equal(pt[k], bt[k]) for k in pt)  # tokens, offsets, doc ids
    read = json.loads(pm.pop("read"))
    assert read.pop("long_documents")["long_documents"] == len(streamed)  # counted in the read stats ...
    assert read == json.loads(bm.pop("read")) and pm == bm  # ... the only difference


def shard_contents(path):
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata())


def test_tokenize_shard_skips_under_the_policy(tmp_path, monkeypatch):
    docs = ["first document", "b" * (8 * PIECE), "third document"]
    cfg, sources = shard_setup(tmp_path, docs, "hf")
    cfg["data"]["long_pretoken"] = "skip"
    monkeypatch.setattr(long_docs, "LONG_DOC_CHARS", PIECE)
    monkeypatch.setattr(long_docs, "PIECE_CHARS", PIECE)
    monkeypatch.setattr(long_docs, "MAX_PRETOKEN_CHARS", 2 * PIECE)
    counts = tokenize_shard(cfg, sources, 0, GPT2, tmp_path / "shard.safetensors")
    assert counts["train"]["documents"] + counts["val"]["documents"] == 2


def test_verify_passes_a_store_that_skipped_a_long_document(tmp_path, monkeypatch):
    """verify re-tokenizes a sample with the same policy: the dropped document is not looked for in the store
    (it raised KeyError when it was among a shard's first verify_sample documents)."""
    from llmpipe.data.verify import verify

    docs = corpus_docs(3) + ["b" * (8 * PIECE)] + corpus_docs(6)[3:]
    write_jsonl(tmp_path / "corpus.jsonl", docs)
    cfg = tiny_config(tmp_path, tokenizer={"source": str(GPT2)}, data={"num_shards": 1, "long_pretoken": "skip"})
    monkeypatch.setattr(long_docs, "LONG_DOC_CHARS", PIECE)
    monkeypatch.setattr(long_docs, "PIECE_CHARS", PIECE)
    monkeypatch.setattr(long_docs, "MAX_PRETOKEN_CHARS", 2 * PIECE)
    out = prepare(tmp_path, cfg)
    got = verify(out["manifest"], [out["view"]], out["tokenizer"], tmp_path / "sources.json", cfg["data"], tmp_path / "v.json")
    assert got["tokenization"] == {"documents_retokenized": len(docs) - 1}


@pytest.mark.parametrize("long", [False, True])
@pytest.mark.parametrize("backend", ["hf", "tiktoken"])
def test_tokenizer_failure_names_source_record_and_size(tmp_path, monkeypatch, backend, long):
    bad = ("BOOM " * (3 * PIECE)) if long else "BOOM in a short document"
    docs = corpus_docs(3) + [bad] + corpus_docs(5)[3:]
    cfg, sources = shard_setup(tmp_path, docs, backend)
    corpus = Path(sources[0])
    lines = corpus.read_text().splitlines(keepends=True)
    corpus.write_text("".join(lines[:2] + ["\n", "\n"] + lines[2:]))  # blank lines: record 3 is on line 6
    monkeypatch.setattr(long_docs, "LONG_DOC_CHARS", PIECE)
    monkeypatch.setattr(long_docs, "PIECE_CHARS", PIECE)
    cls, method = (TiktokenEncoder, "_encode_piece") if backend == "tiktoken" else (HFEncoder, "_encode")
    real = getattr(cls, method)

    def failing(self, texts):
        if any("BOOM" in t for t in texts):
            raise RuntimeError("injected failure")
        return real(self, texts)

    monkeypatch.setattr(cls, method, failing)
    with pytest.raises(EncodeError) as err:
        tokenize_shard(cfg, sources, 0, GPT2, tmp_path / "shard.safetensors")
    msg = str(err.value)
    assert msg.startswith(f"{sources[0]}:6 (record 3): ")  # the file and line the reader found it at
    assert f"{len(bad):,} characters" in msg and "injected failure" in msg
    assert not (tmp_path / "shard.safetensors").exists()
