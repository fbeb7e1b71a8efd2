"""Unreadable sources (G4): each stops the run in one line naming the file (on_bad_record: fail) or is
counted once in the read stats with one log line naming it (skip); never a bare traceback, never silent."""

import bz2
import gzip
import json
import lzma
import os
import subprocess
import sys
import zlib

import pytest

from llmpipe import config as cfgmod
from llmpipe.data.get_data import get_data
from llmpipe.data.readers import BadSource, ReadStats, documents, iter_documents
from llmpipe.data.sources import refuse_repeats
from tests.conftest import GPT2, REPO, corpus_docs, write_jsonl


def data_cfg(sources, **kw):
    return cfgmod.load({"data": {"sources": [str(s) for s in sources], **kw}})["data"]


@pytest.fixture(scope="module")
def docs():
    # ~ 4 MB of short records: a truncated .gz of them still holds whole 1 MiB reads before the cut
    paras = [p for d in corpus_docs(400) for p in d.split("\n\n") if p.strip()]
    return [f"{i}: {p}" for i, p in enumerate(paras * 2)]


def jsonl_bytes(docs) -> bytes:
    return "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()


def read(path, policy, stats=None, **kw):
    return list(iter_documents(data_cfg([path], on_bad_record=policy, **kw), stats))


def skipped_sources(stats: ReadStats) -> dict:
    return {reason: sorted(seen) for reason, seen in stats.bad_sources.items()}


# ---------------------------------------------------------------- truncated / corrupt compression


@pytest.fixture
def truncated_gz(tmp_path, docs):
    whole = gzip.compress(jsonl_bytes(docs))
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole[: len(whole) * 3 // 4])
    return path


def test_truncated_gz_fail_names_file_and_place(truncated_gz):
    with pytest.raises(BadSource, match=rf"^{truncated_gz}: unreadable after line \d+, \d+ records \(EOFError"):
        read(truncated_gz, "fail")


def complete_records(path) -> int:
    """Complete lines in what zlib decompresses of a damaged gzip file before it breaks (the reference)."""
    data = zlib.decompressobj(31).decompress(path.read_bytes())
    return data[: data.rfind(b"\n") + 1].count(b"\n")


def test_truncated_gz_skip_keeps_records_before_the_break(truncated_gz, docs, caplog):
    stats = ReadStats()
    out = read(truncated_gz, "skip", stats)
    # every complete record before the cut, in order (the read that met the cut used to lose up to 1 MiB)
    assert 0 < len(out) < len(docs) and out == docs[: complete_records(truncated_gz)]
    assert skipped_sources(stats) == {"damaged_source": [str(truncated_gz)]}
    d = stats.as_dict()
    assert d["sources_skipped"] == {"damaged_source": 1} and d["sources_skipped_total"] == 1
    assert d["skipped_total"] == 0 and d["documents"] == len(out)
    assert [r.getMessage() for r in caplog.records if str(truncated_gz) in r.getMessage()] != []


@pytest.mark.parametrize("suffix", ["xz", "bz2"])
def test_truncated_xz_bz2_skip_keeps_records_before_the_break(tmp_path, docs, suffix):
    """As for .gz: LZMAFile / BZ2File drop a whole read's bytes when part of it fails (up to 1 MiB of records)."""
    module = {"xz": lzma, "bz2": bz2}[suffix]
    whole = module.compress(jsonl_bytes(docs))
    path = tmp_path / f"cut.jsonl.{suffix}"
    path.write_bytes(whole[: len(whole) * 2 // 3])
    before = (lzma.LZMADecompressor() if suffix == "xz" else bz2.BZ2Decompressor()).decompress(path.read_bytes())
    stats = ReadStats()
    out = read(path, "skip", stats)
    assert 0 < len(out) < len(docs) and out == docs[: before[: before.rfind(b"\n") + 1].count(b"\n")]
    assert skipped_sources(stats) == {"damaged_source": [str(path)]}
    with pytest.raises(BadSource, match=rf"^{path}: unreadable after line {len(out)}, {len(out)} records \(EOFError"):
        read(path, "fail")


def test_truncated_zst_is_not_silent(tmp_path, docs):
    import zstandard

    whole = zstandard.ZstdCompressor().compress(jsonl_bytes(docs))
    path = tmp_path / "cut.jsonl.zst"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(BadSource, match=rf"^{path}: .*truncated"):
        read(path, "fail")
    stats = ReadStats()
    out = read(path, "skip", stats)
    assert out == docs[: len(out)] and skipped_sources(stats) == {"damaged_source": [str(path)]}


@pytest.mark.parametrize("name", ["junk.jsonl.gz", "junk.jsonl.zst", "junk.txt.gz"])
def test_garbage_compressed_bytes(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"this is not compressed at all\n" * 50)
    with pytest.raises(BadSource, match=rf"^{path}: cannot be read"):
        read(path, "fail")
    stats = ReadStats()
    assert read(path, "skip", stats) == []
    assert skipped_sources(stats) == {"unreadable_source": [str(path)]}


@pytest.mark.parametrize("tail", [b"\x1f\x8b\x08garbage" * 20, b"GARBAGE"], ids=["gzip_magic_then_garbage", "garbage"])
def test_garbage_after_good_gzip_member(tmp_path, docs, tail):
    path = tmp_path / "tail.jsonl.gz"
    path.write_bytes(gzip.compress(jsonl_bytes(docs[:300])) + tail)
    with pytest.raises(BadSource, match=rf"^{path}: unreadable after line 300, 300 records"):
        read(path, "fail")
    stats = ReadStats()
    assert read(path, "skip", stats) == docs[:300]  # every record of the good member
    assert str(path) in json.dumps(stats.as_dict()["sources_skipped_examples"])


def test_corrupt_parquet(tmp_path):
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"PAR1 not really parquet PAR1")
    with pytest.raises(BadSource, match=rf"^{path}: cannot be read"):
        read(path, "fail")
    stats = ReadStats()
    assert read(path, "skip", stats) == [] and skipped_sources(stats) == {"unreadable_source": [str(path)]}


# ---------------------------------------------------------------- unreadable, directory, empty


def test_file_gone_after_get_data_is_named(tmp_path, docs):
    """A file unreadable when a tokenize job opens it (removed, or no permission): named, or counted."""
    path = tmp_path / "gone.jsonl"
    with pytest.raises(BadSource, match=rf"^{path}: cannot be read \(FileNotFoundError"):
        list(documents(str(path), data_cfg([path]), ReadStats()))
    stats = ReadStats()
    assert list(documents(str(path), data_cfg([path], on_bad_record="skip"), stats)) == []
    assert skipped_sources(stats) == {"unreadable_source": [str(path)]}


@pytest.mark.parametrize("indent", [None, 2])
def test_json_array_file_is_named_not_counted_as_bad_lines(tmp_path, docs, indent):
    """A .json file of one array (on one line, or pretty-printed): one error saying what it is, or under
    skip one counted source; not 'no text field' once, nor a bad_json count matching no document count."""
    path = tmp_path / "a.json"
    path.write_text(json.dumps([{"text": d} for d in docs[:5]], indent=indent))
    with pytest.raises(BadSource, match=rf"^{path}: is a JSON array, not JSON Lines"):
        list(documents(str(path), data_cfg([path]), ReadStats()))
    stats = ReadStats()
    assert list(documents(str(path), data_cfg([path], on_bad_record="skip"), stats)) == []
    assert skipped_sources(stats) == {"unreadable_source": [str(path)]} and not stats.skipped


@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_directory_as_source(tmp_path, docs, policy):
    write_jsonl(tmp_path / "good.jsonl", docs[:3])
    (tmp_path / "sub.jsonl").mkdir()
    cfg = data_cfg([tmp_path / "good.jsonl", tmp_path / "sub.jsonl"], on_bad_record=policy)
    if policy == "fail":
        with pytest.raises(BadSource, match=rf"^{tmp_path / 'sub.jsonl'}: data source is a directory"):
            get_data(cfg, tmp_path / "sources.json")
        return
    manifest = get_data(cfg, tmp_path / "sources.json")
    assert manifest["sources"][1] == {"source": str(tmp_path / "sub.jsonl"), "unusable": "is a directory, not a file"}
    stats = ReadStats()
    assert list(iter_documents(cfg, stats)) == docs[:3]
    assert skipped_sources(stats) == {"unreadable_source": [str(tmp_path / "sub.jsonl")]}


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads a chmod 000 file")
@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_unreadable_file(tmp_path, docs, policy):
    write_jsonl(tmp_path / "good.jsonl", docs[:3])
    locked = write_jsonl(tmp_path / "locked.jsonl", docs[3:5])
    locked.chmod(0)
    try:
        cfg = data_cfg([tmp_path / "good.jsonl", locked], on_bad_record=policy)
        if policy == "fail":
            with pytest.raises(BadSource, match=rf"^{locked}: data source is not readable"):
                get_data(cfg, tmp_path / "sources.json")
            return
        get_data(cfg, tmp_path / "sources.json")
        stats = ReadStats()
        assert list(iter_documents(cfg, stats)) == docs[:3]
        assert skipped_sources(stats) == {"unreadable_source": [str(locked)]}
    finally:
        locked.chmod(0o644)


@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_empty_file_beside_good_ones(tmp_path, docs, policy):
    write_jsonl(tmp_path / "a.jsonl", docs[:3])
    (tmp_path / "b.jsonl").write_bytes(b"")
    cfg = data_cfg([tmp_path / "*.jsonl"], on_bad_record=policy)
    if policy == "fail":
        with pytest.raises(BadSource, match=rf"^{tmp_path / 'b.jsonl'}: data source is empty \(0 bytes\)"):
            get_data(cfg, tmp_path / "sources.json")
        with pytest.raises(BadSource, match=rf"^{tmp_path / 'b.jsonl'}: holds no records"):
            list(iter_documents(cfg))  # the reader names it too (a file emptied after get_data)
        return
    get_data(cfg, tmp_path / "sources.json")
    stats = ReadStats()
    assert list(iter_documents(cfg, stats)) == docs[:3]
    assert skipped_sources(stats) == {"empty_source": [str(tmp_path / "b.jsonl")]}


@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_blank_only_and_empty_gz_sources_are_named(tmp_path, docs, policy):
    """No 0-byte file, still no record: found by the reader."""
    write_jsonl(tmp_path / "a.jsonl", docs[:2])
    (tmp_path / "blank.jsonl").write_bytes(b"\n  \n\r\n")
    (tmp_path / "empty.jsonl.gz").write_bytes(gzip.compress(b""))
    cfg = data_cfg([tmp_path / "*"], on_bad_record=policy)
    if policy == "fail":
        with pytest.raises(BadSource, match=rf"^{tmp_path / 'blank.jsonl'}: holds no records"):
            list(iter_documents(cfg))
        return
    stats = ReadStats()
    assert list(iter_documents(cfg, stats)) == docs[:2]
    assert skipped_sources(stats) == {"empty_source": [str(tmp_path / "blank.jsonl"), str(tmp_path / "empty.jsonl.gz")]}


@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_lone_empty_source_fails_naming_it(tmp_path, policy):
    """Alone, an empty source stops get-data (not the pack job later with `train split has 0 tokens`)."""
    (tmp_path / "only.jsonl").write_bytes(b"")
    with pytest.raises(BadSource, match=str(tmp_path / "only.jsonl")):
        get_data(data_cfg([tmp_path / "only.jsonl"], on_bad_record=policy), tmp_path / "sources.json")


def get_data_cli(cfg: str, out):
    """`llmpipe get-data` expected to fail: its result, checked to be without a traceback."""
    r = subprocess.run(
        [sys.executable, "-m", "llmpipe", "get-data", "--config", cfg, "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert r.returncode != 0 and "Traceback" not in r.stderr
    return r


def test_get_data_cli_says_one_line(tmp_path):
    (tmp_path / "only.jsonl").write_bytes(b"")
    cfg = json.dumps({"data": {"sources": [str(tmp_path / "only.jsonl")]}})
    r = get_data_cli(cfg, tmp_path / "s.json")
    assert r.stderr.strip().splitlines()[
        -1
    ] == f"llmpipe get-data: error: {tmp_path / 'only.jsonl'}: data source is empty (0 bytes)" + (
        " (on_bad_record: skip would count and skip it)"
    )


def test_a_file_listed_twice_is_refused_naming_both_spellings(tmp_path, docs):
    """A glob and the file's own name, `..` in the path, a file:// URL or a symlink: one file, which read
    twice would give every document twice and put copies in both train and val."""
    (tmp_path / "in").mkdir()
    write_jsonl(tmp_path / "in" / "a.jsonl", docs)
    write_jsonl(tmp_path / "in" / "b.jsonl", docs[:3])
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "in" / "a.jsonl")
    a = str(tmp_path / "in" / "a.jsonl")
    for sources in (
        [str(tmp_path / "in" / "*.jsonl"), a],
        [a, str(tmp_path / "in" / ".." / "in" / "a.jsonl")],
        [f"file://{a}", a],
        [str(tmp_path / "link.jsonl"), a],
    ):
        with pytest.raises(ValueError, match=f"data.sources names {a} twice .*both train and val"):
            get_data(data_cfg(sources), tmp_path / "sources.json")
        assert not (tmp_path / "sources.json").exists()
    assert len(get_data(data_cfg([str(tmp_path / "in" / "*.jsonl")]), tmp_path / "sources.json")["sources"]) == 2
    with pytest.raises(ValueError, match="twice"):  # one string object listed twice
        refuse_repeats([a, a])
    cfg = json.dumps({"data": {"sources": [a, a]}})
    r = get_data_cli(cfg, tmp_path / "s.json")
    assert r.stderr.strip().splitlines()[-1].startswith(f"llmpipe get-data: error: data.sources names {a} twice")


def test_skipped_source_counted_once_in_the_store(tmp_path, docs):
    """Every shard reads every source when sources < shards: the damaged one is counted once in the manifest."""
    from llmpipe.data.token_store import build_manifest
    from llmpipe.data.tokenize import tokenize_shard
    from llmpipe.data.tokenizer import copy_tokenizer
    from tests.conftest import tiny_config

    write_jsonl(tmp_path / "a.jsonl", docs[:40])
    whole = gzip.compress(jsonl_bytes(docs))
    (tmp_path / "b.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    cfg = tiny_config(
        tmp_path,
        data={"sources": [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl.gz")], "num_shards": 3, "on_bad_record": "skip"},
        tokenizer={"source": str(GPT2)},
    )
    copy_tokenizer(str(GPT2), tmp_path / "tok")
    outs = [tmp_path / "tokens" / f"shard-{i:05d}.safetensors" for i in range(3)]
    sources = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl.gz")]
    for i, o in enumerate(outs):
        tokenize_shard(cfg, sources, i, tmp_path / "tok", o)
    read_stats = build_manifest(outs, tmp_path / "tokens" / "manifest.json")["read"]
    assert read_stats["sources_skipped"] == {"damaged_source": 1}
    assert list(read_stats["sources_skipped_examples"]["damaged_source"]) == [str(tmp_path / "b.jsonl.gz")]


def test_report_data_page_names_skipped_sources():
    from llmpipe.report import data_page

    read = ReadStats()
    read.skip(BadSource("damaged_source", "corpus/b.jsonl.gz", "unreadable after line 3"))
    stats = {
        "read": read.as_dict(),
        "tokens": {"train": 10, "val": 2},
        "documents": {"train": 3, "val": 1},
        "tokenizer": {"vocab_size": 50257, "sha256": "0" * 64},
    }
    page = data_page(stats)
    assert "skipped sources" in page and "damaged_source" in page
    assert "skipped sources" not in data_page({**stats, "read": ReadStats().as_dict()})


def test_a_source_of_no_format_we_read_stops_get_data(tmp_path):
    """A .csv.gz source passed get-data and the tokenizer and failed in a tokenize job with a traceback; a
    URL's query no longer hides its format (x.jsonl?download=1 is JSON Lines)."""
    import gzip

    from llmpipe.data.readers import source_format

    (tmp_path / "corpus.csv.gz").write_bytes(gzip.compress(b"text\na document\n"))
    write_jsonl(tmp_path / "ok.jsonl", ["a document"])
    cfg = json.dumps({"data": {"sources": [str(tmp_path / "ok.jsonl"), str(tmp_path / "corpus.csv.gz")]}})
    proc = get_data_cli(cfg, tmp_path / "s.json")
    assert f"unsupported data source format: {tmp_path / 'corpus.csv.gz'} (expected .jsonl" in proc.stderr
    assert source_format("https://h.example/x.jsonl?download=1") == "jsonl"
    assert source_format("https://h.example/x.jsonl.gz#part") == "jsonl" and source_format("s3://b/x.txt.zst") == "text"
