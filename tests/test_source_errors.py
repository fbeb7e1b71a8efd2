"""Unreadable sources (G4): each stops the run in one line naming the file (on_bad_record: fail) or is
counted once in the read stats with one log line naming it (skip); never a bare traceback, never silent."""

import bz2
import gzip
import json
import lzma
import os
import re
import subprocess
import sys
import zlib

import pytest
import zstandard

from llmpipe import config as cfgmod
from llmpipe.data.get_data import get_data
from llmpipe.data.readers import BadRecord, BadSource, ReadStats, documents, iter_documents
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


COMPRESS = {"bz2": bz2.compress, "xz": lzma.compress, "zst": lambda b: zstandard.ZstdCompressor().compress(b)}


@pytest.mark.parametrize("suffix", ["bz2", "xz", "zst"])
@pytest.mark.parametrize("tail", ["garbage", "damaged_stream", "zero_padding"])
def test_bytes_after_the_last_stream_are_never_dropped_silently(tmp_path, docs, suffix, tail):
    """BZ2File / LZMAFile ended without a word at bytes after a stream that are not another one (a damaged
    second stream: its documents lost, none counted); zstd lost the records before such bytes. Now: the
    whole streams' records, then the source named (fail) or counted as damaged (skip); zero padding is no
    damage (xz's stream padding)."""
    good = COMPRESS[suffix](jsonl_bytes(docs[:200]))
    second = bytearray(COMPRESS[suffix](jsonl_bytes(docs[200:300])))
    second[0] ^= 0xFF  # its magic bytes: not a stream any more
    extra = {"garbage": b"GARBAGE", "damaged_stream": bytes(second), "zero_padding": bytes(8)}[tail]
    path = tmp_path / f"two.jsonl.{suffix}"
    path.write_bytes(good + extra)
    stats = ReadStats()
    out = read(path, "skip", stats)
    assert out == docs[:200]
    if tail == "zero_padding" and suffix == "xz":  # xz's own stream padding; bzip2 and zstd call it garbage
        assert read(path, "fail") == docs[:200] and not stats.bad_sources
        path.write_bytes(good + bytes(4) + COMPRESS[suffix](jsonl_bytes(docs[200:300])))  # padding between streams
        assert read(path, "fail") == docs[:300]
        return
    assert skipped_sources(stats) == {"damaged_source": [str(path)]}
    with pytest.raises(BadSource, match=rf"^{path}: unreadable after line 200, 200 records .*are not {suffix[:2]}"):
        read(path, "fail")


@pytest.mark.parametrize("suffix", ["bz2", "xz", "zst"])
def test_a_later_stream_cut_or_damaged_before_any_of_it_was_read_keeps_the_streams_before(tmp_path, docs, suffix):
    """Nothing of the broken stream handed out: no record can be damaged, so under skip the whole streams
    before it are kept and the source counted (not corrupt_source); a cut one is named as cut."""
    first = COMPRESS[suffix](jsonl_bytes(docs[:300]))
    second = COMPRESS[suffix](jsonl_bytes(docs[300:2300]))
    damaged = bytearray(second)
    for i in range(12, 200):  # past its magic and header: in its first block, before it makes a byte
        damaged[i] = 0xFF
    for tail, what in ((second[: len(second) // 2], "EOFError: .* stream ended inside a stream"), (bytes(damaged), "")):
        path = tmp_path / f"later.jsonl.{suffix}"
        path.write_bytes(first + tail)
        stats = ReadStats()
        out = read(path, "skip", stats)
        assert out[:300] == docs[:300] and out == docs[: len(out)], suffix
        assert skipped_sources(stats) == {"damaged_source": [str(path)]}
        if what:
            with pytest.raises(BadSource, match=what):
                read(path, "fail")


@pytest.mark.parametrize("suffix", ["bz2", "xz", "zst"])
def test_a_very_compressible_source_is_read_in_bounded_pieces(tmp_path, suffix):
    """64 MiB of one repeated line in a few KB: read piece by piece, each at most _Streams.OUT, not a whole
    read's output at once (all 64 MiB from the first read before; zstd: all a 64 KiB feed made, until
    2026-11-30 when zstandard's decompressobj, which has no max_length, gave way to compression.zstd)."""
    from llmpipe.data.readers.opener import _open_binary, _Streams

    line = jsonl_bytes(["the same document again"])
    copies = (64 << 20) // len(line)
    path = tmp_path / f"rep.jsonl.{suffix}"
    path.write_bytes(COMPRESS[suffix](line * copies))
    assert path.stat().st_size < _Streams.FEED  # all of it in the first piece of input
    with _open_binary(str(path)) as fh:
        sizes = [len(piece) for piece in iter(lambda: fh.read(1 << 20), b"")]
    assert sum(sizes) == len(line) * copies and max(sizes) <= _Streams.OUT


def _stored_gz_with_a_changed_byte(data: bytes) -> bytes:
    """gzip of stored (uncompressed) deflate blocks, one byte of the text changed: the deflate stream stays
    valid, only the member's CRC at its end finds the change."""
    gz = bytearray(gzip.compress(data, compresslevel=0, mtime=0))
    at = gz.find(b"1: ")  # inside the second document
    gz[at] = ord("X")
    return bytes(gz)


@pytest.mark.parametrize("kind", ["gz_crc", "gz_bits", "bz2", "xz", "zst"])
def test_corrupt_data_inside_a_stream_stops_even_under_skip(tmp_path, docs, kind):
    """A stream damaged after some of its records were read: those may be damaged too (the gzip CRC at the
    member's end, a bz2 / xz block check, zstd's checksum), so they are never kept as good documents: the run
    stops under either policy, naming the file. Before, under skip, 'document 1' came out changed."""
    data = jsonl_bytes(docs)
    if kind == "gz_crc":
        raw = _stored_gz_with_a_changed_byte(data)
    else:
        packed = {
            "gz_bits": lambda b: gzip.compress(b, mtime=0),
            "bz2": bz2.compress,
            "xz": lzma.compress,
            "zst": lambda b: zstandard.ZstdCompressor(write_checksum=True).compress(b),
        }[kind](data)
        raw = bytearray(packed)
        for i in range(len(raw) * 3 // 4, len(raw) * 3 // 4 + 64):  # damage near the end: records read before
            raw[i] ^= 0x55
        raw = bytes(raw)
    path = tmp_path / f"bad.jsonl.{kind.split('_')[0]}"
    path.write_bytes(raw)
    for policy in ("fail", "skip"):
        got = []
        with pytest.raises(BadRecord) as err:
            for _, text in documents(str(path), data_cfg([path], on_bad_record=policy), ReadStats()):
                got.append(text)
        if policy == "fail" and not isinstance(err.value, BadSource):  # damaged text met first: a bad record
            assert err.value.reason == "bad_json" and kind == "gz_bits", err.value
            continue
        assert err.value.reason == "corrupt_source", err.value
        assert re.match(rf"{re.escape(str(path))}: corrupt after .*damaged .*cannot be skipped", str(err.value)), err.value
        if kind == "gz_crc":  # found only by the CRC at the member's end: most of its records had been read
            assert len(got) > len(docs) // 2 and got[1] != docs[1] and got[1].replace("X", "1", 1) == docs[1]


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


@pytest.mark.parametrize("name", ["sub.jsonl", "sub"])  # "sub": no suffix of a format (a tokenize traceback before)
@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_directory_as_source(tmp_path, docs, policy, name):
    write_jsonl(tmp_path / "good.jsonl", docs[:3])
    (tmp_path / name).mkdir()
    cfg = data_cfg([tmp_path / "good.jsonl", tmp_path / name], on_bad_record=policy)
    if policy == "fail":
        with pytest.raises(BadSource, match=rf"^{tmp_path / name}: data source is a directory"):
            get_data(cfg, tmp_path / "sources.json")
        return
    manifest = get_data(cfg, tmp_path / "sources.json")
    assert manifest["sources"][1] == {"source": str(tmp_path / name), "unusable": "is a directory, not a file"}
    stats = ReadStats()
    assert list(iter_documents(cfg, stats)) == docs[:3]
    assert skipped_sources(stats) == {"unreadable_source": [str(tmp_path / name)]}


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
    os.link(a, tmp_path / "hard.jsonl")  # another name of the same inode: no spelling gives it away
    hard = str(tmp_path / "hard.jsonl")
    with pytest.raises(ValueError, match=f"names {hard} twice .*hard links to one file: {a} and {hard}"):
        get_data(data_cfg([a, hard]), tmp_path / "hard-sources.json")
    assert not (tmp_path / "hard-sources.json").exists()
    with pytest.raises(ValueError, match="twice"):  # one string object listed twice
        refuse_repeats([a, a])
    cfg = json.dumps({"data": {"sources": [a, a]}})
    r = get_data_cli(cfg, tmp_path / "s.json")
    assert r.stderr.strip().splitlines()[-1].startswith(f"llmpipe get-data: error: data.sources names {a} twice")


def test_a_local_hf_folder_named_twice_or_beside_its_own_file_is_refused(tmp_path, docs, monkeypatch):
    """A local hf: folder under two spellings, or listed with a data file inside it: read twice, refused as a
    file listed twice is. Two folders (and a Hub id, never looked for on disk) pass."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    for name in ("ds", "other"):
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"text": docs[:3]}), tmp_path / name / "train.parquet")
    real = str(tmp_path / "ds")
    for sources in (["hf:ds", f"hf:{tmp_path}/ds/"], ["hf:ds", "hf:other/../ds"]):
        with pytest.raises(ValueError, match=rf"data.sources names hf:{real} twice"):
            refuse_repeats(sources)
    with pytest.raises(ValueError, match=rf"names {real}/train.parquet twice .*one file read by both: hf:{real} and"):
        refuse_repeats(["hf:ds", "ds/train.parquet"])
    with pytest.raises(ValueError, match="one file read by both"):
        refuse_repeats(["ds/train.parquet", "hf:ds"])
    refuse_repeats(["hf:ds", "hf:other", "hf:someone/dataset"])


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


def cli(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "llmpipe", *map(str, args)], capture_output=True, text=True, cwd=cwd)


def last_line(proc) -> str:
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stderr.strip().splitlines()[-1]


def test_a_glob_matching_nothing_is_one_line_and_leaves_no_earlier_sources_json(tmp_path, docs):
    """A failed get-data leaves no sources.json of an earlier config looking current, and tokenize refuses a
    sources.json that get-data wrote for other data.sources."""
    write_jsonl(tmp_path / "old.jsonl", docs[:3])
    old = json.dumps({"data": {"sources": [str(tmp_path / "old.jsonl")]}, "tokenizer": {"source": str(GPT2)}})
    out = tmp_path / "sources.json"
    assert cli("get-data", "--config", old, "--out", out).returncode == 0 and out.is_file()
    pattern = str(tmp_path / "new-*.jsonl")
    new = json.dumps({"data": {"sources": [pattern]}, "tokenizer": {"source": str(GPT2)}})
    assert (
        last_line(cli("get-data", "--config", new, "--out", out)) == f"llmpipe get-data: error: data source not found: {pattern}"
    )
    assert not out.exists()
    assert cli("get-data", "--config", old, "--out", out).returncode == 0
    shard = tmp_path / "shard.safetensors"
    line = last_line(cli("tokenize", "--config", new, "--sources", out, "--shard", 0, "--tokenizer", GPT2, "--out", shard))
    assert line.startswith(f"llmpipe tokenize: error: {out} was written by get-data for data.sources [") and pattern in line
    assert "run get-data again" in line and not shard.exists()


def test_tokenizer_training_names_a_bad_record_in_one_line(tmp_path, docs):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"text": docs[0]}) + '\n{"text": "unterminated\n')
    cfg = json.dumps({"data": {"sources": [str(tmp_path / "bad.jsonl")]}, "tokenizer": {"source": "train", "vocab_size": 300}})
    assert cli("get-data", "--config", cfg, "--out", tmp_path / "s.json").returncode == 0
    line = last_line(cli("tokenizer", "--config", cfg, "--sources", tmp_path / "s.json", "--out", tmp_path / "tok"))
    assert line.startswith(f"llmpipe tokenizer: error: {tmp_path / 'bad.jsonl'}:2: not valid JSON"), line
    assert not (tmp_path / "tok").exists()


def test_store_and_pack_refusals_are_one_line(tmp_path, docs):
    """token-store: a job folder without read.json (the job did not end); pack: a split without one row."""
    write_jsonl(tmp_path / "a.jsonl", docs[:5])
    cfg = json.dumps({"data": {"sources": [str(tmp_path / "a.jsonl")], "num_shards": 1}, "tokenizer": {"source": str(GPT2)}})
    s = tmp_path / "s.json"
    job = tmp_path / "tokens" / "job-00000"
    assert cli("get-data", "--config", cfg, "--out", s).returncode == 0
    proc = cli("tokenize", "--config", cfg, "--sources", s, "--job", 0, "--tokenizer", GPT2, "--out", job)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = tmp_path / "tokens" / "manifest.json"
    (job / "read.json").rename(tmp_path / "read.json")
    line = last_line(cli("token-store", "--shards", job, "--sources", s, "--out", manifest))
    assert line.startswith("llmpipe token-store: error: ") and "read.json" in line and not manifest.exists()
    (tmp_path / "read.json").rename(job / "read.json")
    assert cli("token-store", "--shards", job, "--sources", s, "--out", manifest).returncode == 0
    big = json.dumps({**json.loads(cfg), "train": {"seq_len": 1 << 20}})  # five short documents: not one row
    line = last_line(cli("pack", "--config", big, "--store", manifest, "--out", tmp_path / "hf"))
    assert line.startswith("llmpipe pack: error: train split has ") and "not one row of seq_len 1048576" in line
    assert not (tmp_path / "hf").exists()
