import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmpipe import config as cfgmod
from llmpipe.data.readers import BadRecord, ReadStats, iter_documents
from tests.conftest import corpus_docs, write_jsonl


def data_cfg(sources, **kw):
    return cfgmod.load({"data": {"sources": [str(s) for s in sources], **kw}})["data"]


@pytest.fixture(scope="module")
def docs():
    return corpus_docs(5)


def test_jsonl_gz_parquet_and_glob_give_same_documents(tmp_path, docs):
    write_jsonl(tmp_path / "a.jsonl", docs[:2])
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as fh:
        fh.write("".join(json.dumps({"text": d}) + "\n" for d in docs[2:4]))
    pq.write_table(pa.table({"text": docs[4:]}), tmp_path / "c.parquet")
    assert list(iter_documents(data_cfg([tmp_path / "*"]))) == docs


def test_zstd_jsonl(tmp_path, docs):
    import zstandard

    raw = "".join(json.dumps({"body": d}) + "\n" for d in docs).encode()
    (tmp_path / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    assert list(iter_documents(data_cfg([tmp_path / "a.jsonl.zst"], text_field="body"))) == docs


def test_plain_text_file_and_paragraph_modes(tmp_path):
    (tmp_path / "t.txt").write_text("first para\nline two\n\n\nsecond para\n")
    assert list(iter_documents(data_cfg([tmp_path / "t.txt"]))) == ["first para\nline two\n\n\nsecond para\n"]
    paras = list(iter_documents(data_cfg([tmp_path / "t.txt"], text_mode="paragraph")))
    assert [p.strip() for p in paras] == ["first para\nline two", "second para"]


def test_hf_dataset_streaming_from_local_folder(tmp_path, docs):
    folder = tmp_path / "ds"
    folder.mkdir()
    pq.write_table(pa.table({"text": docs}), folder / "train.parquet")
    cfg = data_cfg([f"hf:{folder}"], streaming=True, hf_split="train")
    assert list(iter_documents(cfg)) == docs


def test_bad_record_error_names_file_and_line(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "ok"}\n{"content": "no text"}\n')
    with pytest.raises(BadRecord, match=r"a.jsonl:2: no 'text' field"):
        list(iter_documents(data_cfg([tmp_path / "a.jsonl"])))


def test_bad_records_and_empty_docs_skipped_and_counted(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "ok"}\nnot json\n{"text": 3}\n{"text": "   "}\n{"text": "fine"}\n')
    stats = ReadStats()
    out = list(iter_documents(data_cfg([tmp_path / "a.jsonl"], on_bad_record="skip"), stats))
    assert out == ["ok", "fine"]
    assert stats.as_dict() == {"documents": 2, "skipped": {"bad_record": 2, "empty": 1}, "skipped_total": 3}


def test_missing_source_and_unknown_format(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        list(iter_documents(data_cfg([tmp_path / "nope*.jsonl"])))
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported data source format"):
        list(iter_documents(data_cfg([tmp_path / "x.csv"])))


def test_max_documents(tmp_path, docs):
    write_jsonl(tmp_path / "a.jsonl", docs)
    assert list(iter_documents(data_cfg([tmp_path / "a.jsonl"], max_documents=3))) == docs[:3]
