import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmpipe import config as cfgmod
from llmpipe.data.readers import BadRecord, ReadStats, iter_documents
from llmpipe.data.sources import assign, expand_sources
from tests.conftest import corpus_docs, write_jsonl


def data_cfg(sources, **kw):
    return cfgmod.load({"data": {"sources": [str(s) for s in sources], **kw}})["data"]


@pytest.fixture(scope="module")
def docs():
    return corpus_docs(6)


def test_jsonl_gz_zst_parquet_and_glob_give_same_documents(tmp_path, docs):
    import zstandard

    write_jsonl(tmp_path / "a.jsonl", docs[:2])
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as fh:
        fh.write("".join(json.dumps({"text": d}) + "\n" for d in docs[2:4]))
    pq.write_table(pa.table({"text": docs[4:5]}), tmp_path / "c.parquet")
    raw = "".join(json.dumps({"text": d}) + "\n" for d in docs[5:]).encode()
    (tmp_path / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    assert list(iter_documents(data_cfg([tmp_path / "*"]))) == docs


def test_brace_expansion_keeps_order(tmp_path, docs):
    for i, d in enumerate(docs[:3]):
        write_jsonl(tmp_path / f"train.{i + 1}.jsonl", [d])
    assert expand_sources([str(tmp_path / "train.{1..3}.jsonl")]) == [str(tmp_path / f"train.{i}.jsonl") for i in (1, 2, 3)]
    assert list(iter_documents(data_cfg([tmp_path / "train.{3,1}.jsonl"]))) == [docs[2], docs[0]]


def test_a_literal_name_with_glob_characters_and_hidden_files(tmp_path, docs):
    """A file whose name holds glob characters is found by that name; a glob leaves hidden files out (macOS's
    `._x.jsonl`, a `.cache/` folder under `**`), as the shell and Python's glob do, unless it names the dot."""
    for name in ("book [vol 1].jsonl", "what?.jsonl", "a.jsonl", "._a.jsonl"):
        write_jsonl(tmp_path / name, docs[:1])
    (tmp_path / ".cache").mkdir()
    write_jsonl(tmp_path / ".cache" / "b.jsonl", docs[:1])
    t = str(tmp_path)
    assert expand_sources([f"{t}/book [vol 1].jsonl"]) == [f"{t}/book [vol 1].jsonl"]
    assert expand_sources([f"{t}/what?.jsonl"]) == [f"{t}/what?.jsonl"]
    assert expand_sources([f"{t}/*.jsonl"]) == [f"{t}/a.jsonl", f"{t}/book [vol 1].jsonl", f"{t}/what?.jsonl"]
    assert expand_sources([f"{t}/**/*.jsonl"]) == [f"{t}/a.jsonl", f"{t}/book [vol 1].jsonl", f"{t}/what?.jsonl"]
    assert expand_sources([f"{t}/.*.jsonl"]) == [f"{t}/._a.jsonl"]
    assert expand_sources([f"{t}/.cache/*.jsonl"]) == [f"{t}/.cache/b.jsonl"]


def test_text_field_and_plain_text_modes(tmp_path, docs):
    (tmp_path / "a.jsonl").write_text(json.dumps({"body": docs[0]}) + "\n")
    assert list(iter_documents(data_cfg([tmp_path / "a.jsonl"], text_field="body"))) == docs[:1]
    (tmp_path / "t.txt").write_text("first para\nline two\n\n\nsecond para\n")
    assert list(iter_documents(data_cfg([tmp_path / "t.txt"]))) == ["first para\nline two\n\n\nsecond para\n"]
    paras = list(iter_documents(data_cfg([tmp_path / "t.txt"], text_mode="paragraph")))
    assert [p.strip() for p in paras] == ["first para\nline two", "second para"]
    (tmp_path / "w.txt").write_bytes(b"first para\r\nline two\r\n\r\n\r\nsecond para\r\n")  # Windows line ends
    paras = list(iter_documents(data_cfg([tmp_path / "w.txt"], text_mode="paragraph")))
    assert [p.strip() for p in paras] == ["first para\r\nline two", "second para"]


def test_hf_dataset_streaming_from_local_folder(tmp_path, docs):
    folder = tmp_path / "ds"
    folder.mkdir()
    pq.write_table(pa.table({"text": docs}), folder / "train.parquet")
    for streaming in (True, False):
        assert list(iter_documents(data_cfg([f"hf:{folder}"], streaming=streaming))) == docs


BAD = (
    b'{"text": "good one"}\n'
    b'{"text": "bad \xff\xfe utf8"}\n'
    b"not json at all\n"
    b'{"content": "wrong field"}\n'
    b'{"text": 42}\n'
    b'{"text": "has a \\u0000 NUL"}\n'
    b'{"text": "   "}\n'
    b'{"text": "good two"}\n'
    b'{"text": "' + b"x" * 200 + b'"}\n'
)


def test_bad_records_fail_with_location(tmp_path):
    (tmp_path / "bad.jsonl").write_bytes(BAD)
    with pytest.raises(BadRecord, match=r"bad.jsonl:2: invalid UTF-8"):
        list(iter_documents(data_cfg([tmp_path / "bad.jsonl"])))


def test_bad_records_skipped_with_exact_counts_and_order_kept(tmp_path):
    (tmp_path / "bad.jsonl").write_bytes(BAD)
    stats = ReadStats()
    out = list(iter_documents(data_cfg([tmp_path / "bad.jsonl"], on_bad_record="skip", max_document_chars=100), stats))
    assert out == ["good one", "good two"]
    assert dict(stats.skipped) == {
        "invalid_utf8": 1,
        "bad_json": 1,
        "missing_field": 1,
        "not_string": 1,
        "nul_bytes": 1,
        "empty": 1,
        "too_long": 1,
    }
    assert len(stats.examples["bad_json"]) == 1
    assert stats.examples["bad_json"][0].startswith(f"{tmp_path / 'bad.jsonl'}:3: not valid JSON")


def test_numbers_beyond_a_double_are_json_and_nan_is_not(tmp_path):
    """1e999 is valid JSON (orjson refuses it; the record is kept); NaN is not, nor a lone surrogate after one."""
    (tmp_path / "num.jsonl").write_bytes(
        b'{"text": "one", "score": 1e999}\n'
        b'{"meta": {"x": [-1E400, 2]}, "text": "two"}\n'
        b'{"text": "not this", "score": NaN}\n'
        b'{"score": 1e999, "text": "nor \\ud800 this"}\n'
        b'{"text": "three"}\n'
        b'{"text": "four", "score": 1e999, "id": 18446744073709551616, "n": 1' + b"0" * 400 + b"}\n"
    )
    stats = ReadStats()
    out = list(iter_documents(data_cfg([tmp_path / "num.jsonl"], on_bad_record="skip"), stats))
    assert out == ["one", "two", "three", "four"]  # four: integers beyond 64 bits beside it (Python's json reads them)
    assert dict(stats.skipped) == {"bad_json": 2}
    assert [e.split(": ")[0].rsplit(":", 1)[1] for e in stats.examples["bad_json"]] == ["3", "4"]


@pytest.mark.parametrize("kind", ["parquet", "hf"])
def test_parquet_text_that_is_not_utf8_is_a_bad_record(tmp_path, kind):
    """Arrow does not check a string column's UTF-8 on read: a value that is not UTF-8 is a bad record named by
    its row (skip: counted, the rows around it kept; fail: one error naming it), in a Parquet file or an
    `hf:` dataset of Parquet files."""
    values = pa.array([b"good one", b"bad \xff utf8", b"good two"], pa.binary()).view(pa.string())
    (tmp_path / "d").mkdir()
    pq.write_table(pa.table({"text": values}), tmp_path / "d" / "train.parquet")
    source = tmp_path / "d" / "train.parquet" if kind == "parquet" else f"hf:{tmp_path / 'd'}"
    stats = ReadStats()
    assert list(iter_documents(data_cfg([source], on_bad_record="skip"), stats)) == ["good one", "good two"]
    where = f"{source}:row 1" if kind == "parquet" else f"{source}[1]"
    assert dict(stats.skipped) == {"invalid_utf8": 1} and stats.examples["invalid_utf8"][0].startswith(f"{where}: invalid UTF-8")
    with pytest.raises(BadRecord, match="invalid UTF-8 at byte 4"):
        list(iter_documents(data_cfg([source], on_bad_record="fail")))


def test_wrong_parquet_column_is_named(tmp_path):
    pq.write_table(pa.table({"content": ["a"]}), tmp_path / "x.parquet")
    with pytest.raises(BadRecord, match="no 'text' column \\(columns: content\\)"):
        list(iter_documents(data_cfg([tmp_path / "x.parquet"])))


def test_ten_megabyte_document_is_kept_whole(tmp_path):
    big = ("All work and no play makes Jack a dull boy. " * 240_000)[:10_000_000]
    write_jsonl(tmp_path / "big.jsonl", ["small", big, "after"])
    assert list(iter_documents(data_cfg([tmp_path / "big.jsonl"]))) == ["small", big, "after"]


def test_missing_source_and_unknown_format(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        expand_sources([str(tmp_path / "nope*.jsonl")])
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported data source format"):
        list(iter_documents(data_cfg([tmp_path / "x.csv"])))


def test_max_records_per_source(tmp_path, docs):
    write_jsonl(tmp_path / "a.jsonl", docs)
    assert list(iter_documents(data_cfg([tmp_path / "a.jsonl"], max_records_per_source=3))) == docs[:3]


def test_shard_assignment_is_a_partition():
    files = [f"f{i}" for i in range(5)]
    whole = [assign(files, 3, s) for s in range(3)]
    assert sorted(i for a in whole for i, _ in a.sources) == list(range(5)) and not whole[0].record_level
    record = [assign(files[:2], 4, s) for s in range(4)]
    assert all(a.record_level for a in record)
    assert sorted(r for a in record for r in range(40) if a.keep(r)) == list(range(40))


def test_https_style_url_through_fsspec(tmp_path, docs):
    """http(s):// sources go through fsspec's HTTP filesystem; served here from loopback."""
    import functools
    import http.server
    import threading

    with gzip.open(tmp_path / "c.jsonl.gz", "wt") as fh:
        fh.write("".join(json.dumps({"text": d}) + "\n" for d in docs))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/c.jsonl.gz"
        assert expand_sources([url]) == [url]
        assert list(iter_documents(data_cfg([url]))) == docs
    finally:
        server.shutdown()
