"""Records too long to hold (issue G7): a JSONL line or a text file over readers.HUGE_RECORD_BYTES is read
in bounded chunks and tokenized as a stream (readers.StreamedText -> long_docs.plan_stream/StreamPieces).
With the threshold made small, every such record gives the very store (tokens, offsets, doc ids, read
stats) and the very BadRecord reasons and locations of the normal path; a ~100 MB record is tokenized in a
subprocess under a stated peak RSS."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap

import pytest
from safetensors import safe_open

from llmpipe.data import long_docs, readers
from llmpipe.data.readers import BadRecord, limits, opener
from llmpipe.data.tokenize import tokenize_shard
from tests.conftest import GPT2, corpus_docs, tiny_config

PIECE = 4096
SMALL = 64 << 10  # the threshold in the streamed runs


def text_of(seed: int, chars: int) -> str:
    """Corpus text with what JSON escapes: quotes, backslashes, newlines, tabs, NULs aside, emoji (surrogate
    pairs under ensure_ascii), CJK, combining marks, U+2028."""
    rng = random.Random(seed)
    base = " ".join(corpus_docs(30))
    extra = ['"quoted"', "back\\slash", "\n", "\r\n", "\t", "😀", "👍🏽", "日本語", "e\u0301", "\u2028", "\\u0041", "\\\\", "\\"]
    out, n = [], 0
    while n < chars:
        piece = base[rng.randrange(len(base) - 200) :][: rng.randint(1, 200)] if rng.random() < 0.7 else rng.choice(extra)
        out.append(piece)
        n += len(piece)
    return "".join(out)[:chars]


def line(record: dict, ascii_only: bool = True, end: bytes = b"\n") -> bytes:
    return json.dumps(record, ensure_ascii=ascii_only).encode() + end


def good_lines() -> bytes:
    big = text_of(1, 150_000)
    return b"".join(
        [
            line({"text": "a small record first"}),
            # the text field after others, a nested "text" key, a "text" inside another string, CRLF line end
            line({"id": 7, "meta": {"text": "nested, not this"}, "note": 'say "text": "no"', "text": big}, True, b"\r\n"),
            line({"text": "small again"}),
            # text first, raw UTF-8 (not ensure_ascii), then a long other string and a nested array
            line({"text": text_of(2, 120_000), "other": text_of(3, 90_000), "z": [1, {"text": "x"}, None]}, False),
            # a huge line because of another field: the text itself short
            line({"other": text_of(4, 100_000), "text": "short text of a huge line"}),
            # only escapes: \uXXXX everywhere, surrogate pairs across every chunk boundary
            line({"text": "😀é\u0000"[:2] * 40_000}),
            line({"text": "the last one"}, True, b""),  # no final newline
        ]
    )


def run(tmp_path, name: str, data: bytes, monkeypatch, streamed: bool, suffix=".jsonl", backend="tiktoken", **data_cfg):
    """tokenize_shard of one source holding `data`: (tensors, metadata) of the shard."""
    src = tmp_path / f"corpus{suffix}"
    src.write_bytes(data)
    cfg = tiny_config(
        tmp_path, tokenizer={"source": str(GPT2), "backend": backend}, data={"num_shards": 1, "sources": [str(src)], **data_cfg}
    )
    with monkeypatch.context() as m:
        m.setattr(long_docs, "LONG_DOC_CHARS", PIECE)
        m.setattr(long_docs, "PIECE_CHARS", PIECE)
        if streamed:
            m.setattr(limits, "HUGE_RECORD_BYTES", SMALL)
            m.setattr(limits, "LINE_CHUNK", 8191)
            m.setattr(limits, "HUGE_CHUNK", 4099)  # odd chunks: cuts inside escapes, pairs, UTF-8 sequences
            m.setattr(limits, "LONG_STRING", 8 << 10)
        out = tmp_path / f"{name}.safetensors"
        tokenize_shard(cfg, [str(src)], 0, GPT2, out)
    with safe_open(str(out), framework="numpy") as f:
        return {k: f.get_tensor(k).tolist() for k in f.keys()}, dict(f.metadata())


def streamed_count(monkeypatch) -> list:
    """Counts the documents that come as StreamedText."""
    seen = []
    real = readers.check

    def check(where, value, cfg):
        seen.append(isinstance(value, readers.StreamedText))
        return real(where, value, cfg)

    monkeypatch.setattr(readers, "check", check)
    return seen


@pytest.mark.parametrize("backend", ["tiktoken", "hf"])
def test_streamed_jsonl_records_give_the_same_store(tmp_path, monkeypatch, backend):
    data = good_lines()
    normal = run(tmp_path, "normal", data, monkeypatch, False, backend=backend)
    seen = streamed_count(monkeypatch)
    streamed = run(tmp_path, "streamed", data, monkeypatch, True, backend=backend)
    assert sum(seen) == 3  # the three huge lines with a long text came as streams
    assert streamed[0] == normal[0]  # tokens, offsets, doc ids
    assert streamed[1] == normal[1]  # metadata: read stats (documents, UTF-8 bytes, long documents), sha256s
    read = json.loads(normal[1]["read"])
    assert read["documents"] == 7 and read["long_documents"]["long_documents"] == 3


def test_bom_and_blank_lines_before_a_streamed_record(tmp_path, monkeypatch):
    data = opener.BOM + line({"text": text_of(5, 100_000)}) + b"\n  \n" + line({"text": text_of(6, 100_000)}, False, b"\r")
    data += b" " * (SMALL * 2) + b"\n" + line({"text": "after a huge blank line"})
    normal = run(tmp_path, "normal", data, monkeypatch, False)
    streamed = run(tmp_path, "streamed", data, monkeypatch, True)
    assert streamed == normal
    assert json.loads(normal[1]["read"])["documents"] == 3


def test_streamed_record_with_a_number_beyond_a_double(tmp_path, monkeypatch):
    data = b'{"score": 1e999, "text": ' + json.dumps(text_of(7, 100_000)).encode() + b"}\n" + line({"text": "small"})
    normal = run(tmp_path, "normal", data, monkeypatch, False)
    assert run(tmp_path, "streamed", data, monkeypatch, True) == normal
    assert json.loads(normal[1]["read"])["documents"] == 2


BIG = text_of(9, 100_000)
BAD = {
    "missing_field": line({"body": BIG}),
    "nested_only": line({"meta": {"text": BIG}}),
    "not_string": line({"other": BIG, "text": 12345}),
    "list_text": line({"other": BIG, "text": [1, 2]}),
    "broken_json": line({"text": BIG})[:-3] + b"\n",  # no closing quote nor brace
    "bad_after_text": line({"text": BIG})[:-2] + b",}\n",  # a trailing comma after the text
    "invalid_escape": line({"text": BIG})[:50_000] + b"\\x" + line({"text": BIG})[50_000:],
    "lone_surrogate": line({"text": BIG[:50_000] + "\ud83d" + BIG[50_000:]}),
    "invalid_utf8": line({"text": BIG})[:70_001] + b"\xff" + line({"text": BIG})[70_001:],
    "invalid_utf8_and_json": b"{" + line({"text": BIG})[:70_001] + b"\xc3",
    "nul": line({"text": BIG[:60_000] + "\x00" + BIG[60_000:]}),
    "too_long": line({"text": BIG + BIG}),
    "empty": line({"text": " \n\t" * 40_000}),
    "array": line([BIG]),
    # the last of two text keys wins, a NUL in it; it must not pass for the streamed one (our placeholder's look)
    "streamed_then_placeholder_like": b'{"text": ' + json.dumps(BIG).encode() + b', "text": "\\u0000llmpipe-huge-0"}\n',
}


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_bad_streamed_records_are_judged_as_the_normal_path_judges_them(tmp_path, monkeypatch, case, policy):
    data = line({"text": "a good one"}) + BAD[case] + line({"text": "another good one"})
    limits = {"on_bad_record": policy, "max_document_chars": 150_000}
    if policy == "fail" and case != "empty":
        errs = []
        for streamed in (False, True):
            with pytest.raises(BadRecord) as err:
                run(tmp_path, f"s{streamed}", data, monkeypatch, streamed, **limits)
            errs.append(err.value)
        normal, got = errs
        assert (got.reason, got.where) == (normal.reason, normal.where)
        assert got.where.endswith(":2")
        if got.reason != "bad_json":  # orjson's message names a place in the record; ours another
            assert str(got) == str(normal)
        return
    normal = run(tmp_path, "normal", data, monkeypatch, False, **limits)
    streamed = run(tmp_path, "streamed", data, monkeypatch, True, **limits)
    assert streamed[0] == normal[0]
    rn, rs = json.loads(normal[1].pop("read")), json.loads(streamed[1].pop("read"))
    assert streamed[1] == normal[1]
    assert rs["skipped"] == rn["skipped"] and sum(rs["skipped"].values()) == 1
    where = {r: [e.split(": ", 1)[0] for e in ex] for r, ex in rn["skipped_examples"].items()}
    assert {r: [e.split(": ", 1)[0] for e in ex] for r, ex in rs["skipped_examples"].items()} == where
    if "bad_json" not in rn["skipped"]:
        assert rs == rn


@pytest.mark.parametrize("backend", ["tiktoken", "hf"])
def test_streamed_text_file_gives_the_same_store(tmp_path, monkeypatch, backend):
    data = opener.BOM + text_of(11, 200_000).replace("\\", "/").encode()
    normal = run(tmp_path, "normal", data, monkeypatch, False, ".txt", backend, text_mode="file")
    seen = streamed_count(monkeypatch)
    streamed = run(tmp_path, "streamed", data, monkeypatch, True, ".txt", backend, text_mode="file")
    assert seen == [True] and streamed == normal


@pytest.mark.parametrize("case", ["invalid_utf8", "invalid_utf8_after_bom", "nul", "empty"])
def test_bad_streamed_text_file(tmp_path, monkeypatch, case):
    """The same outcome held whole or streamed; invalid UTF-8 named at its file offset (a byte order mark
    counted, as paragraph mode counts it), found here by decoding the whole file."""
    body = text_of(12, 100_000).encode()
    bad = body[:80_001] + b"\xe2\x82" + body[80_001:]
    data = {"invalid_utf8": bad, "invalid_utf8_after_bom": opener.BOM + bad, "nul": body + b"\x00", "empty": b" \n" * 60_000}[
        case
    ]
    if case.startswith("invalid"):
        skip = len(opener.BOM) if data.startswith(opener.BOM) else 0
        with pytest.raises(UnicodeDecodeError) as exc:
            data[skip:].decode("utf-8")
        offset = skip + exc.value.start
    for policy in ("fail", "skip"):
        got = []
        for streamed in (False, True):
            try:
                meta = run(
                    tmp_path, f"{policy}{streamed}", data, monkeypatch, streamed, ".txt", text_mode="file", on_bad_record=policy
                )[1]
                got.append(json.loads(meta["read"]))
            except BadRecord as err:
                got.append((err.reason, str(err)))
        assert got[0] == got[1]
        if case.startswith("invalid") and policy == "fail":
            assert got[0][0] == "invalid_utf8" and got[0][1].endswith(f": invalid UTF-8 at byte {offset}")


def test_special_token_text_in_a_streamed_document(tmp_path, monkeypatch):
    text = (text_of(13, 40_000) + "<|endoftext|>") * 3
    data = line({"text": text})
    assert run(tmp_path, "streamed", data, monkeypatch, True) == run(tmp_path, "normal", data, monkeypatch, False)


MEMORY_MB, RSS_BOUND = 100, 600 << 20


@pytest.mark.slow
def test_memory_of_a_100mb_single_line_record(tmp_path):
    """MEMORY TEST: a ~100 MB one-line JSONL document through tokenize_shard in a fresh process (tiktoken,
    default thresholds) peaks under RSS_BOUND (the normal path held ~6x the record)."""
    text = (" ".join(corpus_docs(200)) + ' "q" \\ 😀 ').replace("\r", " ")
    src = tmp_path / "huge.jsonl"
    with open(src, "w") as fh:
        fh.write('{"id": 1, "text": "')
        chunk, written = json.dumps(text)[1:-1], 0
        while written < MEMORY_MB * 10**6:
            fh.write(chunk)
            written += len(chunk)
        fh.write('"}\n')
    script = textwrap.dedent(
        f"""
        from llmpipe.data.tokenize import tokenize_shard
        from tests.conftest import GPT2, tiny_config
        from pathlib import Path
        cfg = tiny_config(Path({str(tmp_path)!r}), tokenizer={{"source": str(GPT2), "backend": "tiktoken"}},
                          data={{"num_shards": 1, "sources": [{str(src)!r}]}})
        counts = tokenize_shard(cfg, [{str(src)!r}], 0, GPT2, Path({str(tmp_path / "out.safetensors")!r}))
        assert counts["train"]["documents"] + counts["val"]["documents"] == 1
        print([x for x in open("/proc/self/status") if x.startswith("VmHWM:")][0].split()[1])
        """
    )
    # VmHWM of the child's own memory after exec (ru_maxrss would carry the forking pytest's size over exec)
    proc = subprocess.run([sys.executable, "-c", script], cwd=str(GPT2.parents[2]), capture_output=True, text=True, check=True)
    peak = int(proc.stdout.split()[-1]) * 1024
    assert peak < RSS_BOUND, f"peak RSS {peak / 2**20:.0f} MiB"
