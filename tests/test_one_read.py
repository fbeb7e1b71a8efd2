"""One read of every source byte per run (H3): a tokenize job reads each source once and deals its records
to its shards, in this process or in worker processes; every shard is byte for byte the one a one-shard job
writes, whatever the grouping; the bytes read (read.json, summed in the store's manifest) equal the
sources' sizes for .jsonl.gz, .jsonl.zst, plain .jsonl, paragraph .txt and Parquet (other columns too), and
each source's sha256 is taken from that one read (get-data reads no source)."""

import gzip
import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from llmpipe.data import stfile
from llmpipe.data.get_data import get_data, read_sources
from llmpipe.data.readers import BadSource, limits, opener
from llmpipe.data.readers.opener import SourceSizeChanged
from llmpipe.data.token_store import main as token_store_main
from llmpipe.data.tokenize import job_shards, num_jobs, shard_name, tokenize_job, tokenize_shard
from llmpipe.data.tokenizer import copy_tokenizer
from tests.conftest import GPT2, corpus_docs, tiny_config

SHARDS = 5
DOCS = corpus_docs(60)


def _write(kind: str, folder) -> str:
    lines = "".join(json.dumps({"text": d}) + "\n" for d in DOCS).encode()
    if kind == "gz":
        path = folder / "corpus.jsonl.gz"
        path.write_bytes(gzip.compress(lines))
    elif kind == "zst":
        path = folder / "corpus.jsonl.zst"
        path.write_bytes(zstandard.ZstdCompressor().compress(lines))
    elif kind == "jsonl":
        path = folder / "corpus.jsonl"
        path.write_bytes(lines)
    elif kind == "txt":
        path = folder / "corpus.txt"
        # CRLF inside paragraphs: a streamed document crosses to a worker process with its line ends as they are
        path.write_bytes("\n\n".join(d.replace("\n\n", "\n").replace("\n", "\r\n") for d in DOCS).encode())
    elif kind == "parquet":
        path = folder / "corpus.parquet"
        pq.write_table(pa.table({"text": DOCS}), path, row_group_size=16)
    elif kind == "parquet_columns":  # another column beside the text, in every row group: read through, not skipped
        path = folder / "corpus.parquet"
        pq.write_table(pa.table({"id": list(range(len(DOCS))), "text": DOCS}), path, row_group_size=16)
    else:  # the text column first: the last row group's other column is read on to the footer (not read again)
        path = folder / "corpus.parquet"
        pq.write_table(pa.table({"text": DOCS, "id": list(range(len(DOCS)))}), path, row_group_size=16)
    return str(path)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok") / "gpt2"
    copy_tokenizer(GPT2, out)
    return str(out)


def _setup(tmp_path, kind: str, per_job=None, text_mode="paragraph"):
    source = _write(kind, tmp_path)
    data = {"sources": [source], "num_shards": SHARDS, "shards_per_job": per_job, "text_mode": text_mode}
    cfg = tiny_config(tmp_path, data=data, tokenizer={"source": str(tmp_path / "tok")})
    get_data(cfg["data"], tmp_path / "sources.json")
    return cfg, source


KINDS = ["gz", "zst", "jsonl", "txt", "txt_streamed", "txt_file_streamed", "parquet", "parquet_columns", "parquet_text_first"]


@pytest.mark.parametrize("kind", KINDS + ["parquet_big_footer"])
def test_one_job_reads_each_byte_once_and_writes_the_shards_of_one_shard_jobs(tmp_path, tok, kind, monkeypatch):
    mode = "file" if kind == "txt_file_streamed" else "paragraph"
    if kind == "parquet_big_footer":  # a footer longer than a short run's kept bytes: kept all the same
        monkeypatch.setattr(opener._Hashes, "KEEP", 256)
        kind = "parquet_text_first"
    if kind.endswith("_streamed"):  # a file over HUGE_RECORD_BYTES: read in chunks (paragraphs as found; or the
        monkeypatch.setattr(limits, "HUGE_RECORD_BYTES", 4096)  # whole file, one document, spooled as read)
        monkeypatch.setattr(limits, "HUGE_CHUNK", 1000)
        kind = "txt"
    cfg, source = _setup(tmp_path, kind, text_mode=mode)
    sources = str(tmp_path / "sources.json")
    alone = tmp_path / "alone"
    names, listed = read_sources(sources)
    for s in range(SHARDS):
        tokenize_shard(cfg, names, s, tok, alone / shard_name(s), sources_key=listed["key"])
    for threads in (1, 2):
        job = tmp_path / f"job-t{threads}"
        tokenize_job(cfg, sources, 0, tok, job, threads, per_job=SHARDS)
        for s in range(SHARDS):
            assert (job / shard_name(s)).read_bytes() == (alone / shard_name(s)).read_bytes(), (kind, threads, s)
        read = json.loads((job / "read.json").read_text())
        size = (tmp_path / source).stat().st_size
        assert read["bytes_read"] == {source: size}, (kind, threads)
        # its sha256, taken as it was read (get-data reads no source)
        assert read["sha256"] == [[0, 0, size, hashlib.sha256((tmp_path / source).read_bytes()).hexdigest()]], (kind, threads)
    documents = [json.loads(stfile.header(alone / shard_name(s))[0]["__metadata__"]["counts"]) for s in range(SHARDS)]
    if mode == "file":  # the file is one document
        assert sum(c[split]["documents"] for c in documents for split in ("train", "val")) == 1
    else:
        assert all(c["train"]["documents"] > 0 for c in documents)  # every shard got its share


def test_manifest_counts_reads_and_names_a_grouping_that_reads_twice(tmp_path, tok):
    cfg, source = _setup(tmp_path, "gz", per_job=3)  # 5 shards in jobs of 3 + 2: two reads
    sources = str(tmp_path / "sources.json")
    d = cfg["data"]
    jobs = [tmp_path / "tokens" / f"job-{j:05d}" for j in range(num_jobs(d))]
    for j, folder in enumerate(jobs):
        assert len(job_shards(d, j)) in (3, 2)
        tokenize_job(cfg, sources, j, tok, folder, 1)
    out = tmp_path / "tokens" / "manifest.json"
    token_store_main(["--shards", *map(str, jobs), "--sources", sources, "--out", str(out)])
    reads = json.loads(out.read_text())["source_reads"]
    size = (tmp_path / "corpus.jsonl.gz").stat().st_size
    assert reads["source_bytes"] == size and reads["bytes_read"] == 2 * size and reads["ratio"] == 2.0
    assert reads["not_read_once"] == {source: {"size": size, "bytes_read": 2 * size}}

    one = tmp_path / "one"
    tokenize_job(cfg, sources, 0, tok, one / "job-00000", 2, per_job=SHARDS)
    token_store_main(["--shards", str(one / "job-00000"), "--sources", sources, "--out", str(one / "manifest.json")])
    manifest, grouped = json.loads((one / "manifest.json").read_text()), json.loads(out.read_text())
    assert manifest["source_reads"]["ratio"] == 1.0 and manifest["source_reads"]["not_read_once"] == {}
    assert manifest["fingerprint"] == grouped["fingerprint"] and manifest["totals"] == grouped["totals"]
    digest = hashlib.sha256((tmp_path / "corpus.jsonl.gz").read_bytes()).hexdigest()
    assert manifest["source_sha256"] == grouped["source_sha256"] == {source: digest}

    # a job that read other bytes for the same source (the file changed in between): the store stops
    read = jobs[1] / "read.json"
    got = json.loads(read.read_text())
    got["sha256"][0][3] = "0" * 64
    read.write_text(json.dumps(got))
    with pytest.raises(SystemExit, match="llmpipe token-store: error: .*changed while it was tokenized"):
        token_store_main(["--shards", *map(str, jobs), "--sources", sources, "--out", str(out)])

    # a job killed after its shards, before its read.json (written last): named, not a store without its reads
    read.unlink()
    with pytest.raises(SystemExit, match=rf"llmpipe token-store: error: tokenize job folder {jobs[1]} has no read.json"):
        token_store_main(["--shards", *map(str, jobs), "--sources", sources, "--out", str(out)])


@pytest.mark.parametrize("kind", ["jsonl", "jsonl_max_records", "parquet"])
def test_a_source_that_changed_size_after_get_data_stops_the_job(tmp_path, tok, kind):
    """Found once the shards are written: they are taken away again, in a job (no shard stays looking
    complete beside the missing read.json) and for one shard alone (`--shard`, which checked nothing).
    Also where the readers stop before the new bytes: at Parquet's footer, at max_records_per_source."""
    cfg, source = _setup(tmp_path, kind.removesuffix("_max_records"))
    if kind == "jsonl_max_records":  # 2 MB: the first 5 records are read long before the end
        Path(source).write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS * 80))
        get_data(cfg["data"], tmp_path / "sources.json")
    if kind == "parquet":  # a new file with one more row: its footer moved, the readers read up to it
        pq.write_table(pa.table({"text": DOCS + ["one more"]}), source, row_group_size=16)
    else:
        with open(source, "a") as fh:
            fh.write(json.dumps({"text": "one more"}) + "\n")
    if kind == "jsonl_max_records":
        cfg["data"]["max_records_per_source"] = 5
    with pytest.raises(SourceSizeChanged, match="changed after get-data recorded its size"):
        tokenize_job(cfg, str(tmp_path / "sources.json"), 0, tok, tmp_path / "job", 1, per_job=SHARDS)
    assert list((tmp_path / "job").iterdir()) == []
    from llmpipe.data.tokenize import main as tokenize_main

    shard = tmp_path / "alone.safetensors"
    args = ["--config", json.dumps(cfg), "--sources", str(tmp_path / "sources.json"), "--shard", "0"]
    with pytest.raises(SystemExit, match="llmpipe tokenize: error: data source .* changed after get-data"):
        tokenize_main([*args, "--tokenizer", str(tok), "--out", str(shard)])
    assert not shard.exists()


@pytest.mark.parametrize("threads", [1, 2])
def test_a_job_fits_an_open_files_limit_of_1024(tmp_path, tok, threads):
    """2 split files a shard: 600 shards in one process, or 550 in each of 2 workers, kept open need 1200 /
    1100 (before, kept open up to 1024 shards a process: 'Too many open files' under the common soft limit of
    1024). Run in a process with that limit."""
    import subprocess
    import sys

    shards = 600 if threads == 1 else 1100
    source = _write("jsonl", tmp_path)
    cfg = tiny_config(tmp_path, data={"sources": [source], "num_shards": shards}, tokenizer={"source": str(tok)})
    get_data(cfg["data"], tmp_path / "sources.json")
    script = (
        "import json, resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "from llmpipe.data.tokenize import tokenize_job\n"
        "cfg, sources, tok, out, threads, n = json.loads(sys.argv[1])\n"
        "tokenize_job(cfg, sources, 0, tok, out, threads, per_job=n)\n"
    )
    job = tmp_path / "job"
    args = json.dumps([cfg, str(tmp_path / "sources.json"), str(tok), str(job), threads, shards])
    proc = subprocess.run([sys.executable, "-c", script, args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list(job.glob("shard-*.safetensors"))) == shards
    assert json.loads((job / "read.json").read_text())["bytes_read"] == {source: Path(source).stat().st_size}


def test_pack_and_verify_of_1200_shards_fit_an_open_files_limit_of_1024(tmp_path, tok):
    """pack (hf with segment ids, litgpt, megatron) and verify of a store of 1200 shards, in a process with the
    common soft limit of 1024 open files: a split stream keeps at most token_store.MAPS_OPEN shards mapped (a
    map holds a descriptor) and verify as many open (before: pack hf held 2 a shard, litgpt and verify 1 a
    shard, and failed with 'Too many open files' from about 450 / 900 shards)."""
    import subprocess
    import sys

    shards = 1200
    source = tmp_path / "many.jsonl"  # a document for every shard's train split
    source.write_text("".join(json.dumps({"text": f"document {i}: " + DOCS[i % len(DOCS)][:200]}) + "\n" for i in range(1400)))
    cfg = tiny_config(tmp_path, data={"sources": [str(source)], "num_shards": shards, "views": ["hf", "litgpt", "megatron"]})
    cfg["tokenizer"]["source"] = str(tok)
    sources = tmp_path / "sources.json"
    get_data(cfg["data"], sources)
    job = tmp_path / "tokens" / "job-00000"
    tokenize_job(cfg, str(sources), 0, tok, job, 1, per_job=shards)
    manifest = tmp_path / "tokens" / "manifest.json"
    token_store_main(["--shards", str(job), "--sources", str(sources), "--out", str(manifest)])
    script = (
        "import json, resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "from pathlib import Path\n"
        "from llmpipe.data.pack_views import build_view\n"
        "from llmpipe.data.verify import verify\n"
        "cfg, manifest, tok, sources, out = json.loads(sys.argv[1])\n"
        "views = [Path(out) / f for f in ('hf', 'litgpt', 'megatron')]\n"
        "for view in views:\n"
        "    build_view(manifest, view.name, view, cfg, tok)\n"
        "verify(manifest, views, Path(tok), Path(sources), cfg['data'], Path(out) / 'verify.json', 2)\n"
    )
    args = json.dumps([cfg, str(manifest), str(tok), str(sources), str(tmp_path)])
    proc = subprocess.run([sys.executable, "-c", script, args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stored = json.loads(manifest.read_text())
    assert len(stored["shards"]) == shards and sum(1 for e in stored["shards"] if e["counts"]["train"]["tokens"]) > 1000
    report = json.loads((tmp_path / "verify.json").read_text())
    assert set(report["views"]) == {"hf", "litgpt", "megatron"}
    assert (
        report["views"]["hf"]["conservation"]["train"]["rows"]
        == json.loads((tmp_path / "hf" / "view.json").read_text())["train"]["rows"]
    )


def test_a_worker_failure_stops_the_job_naming_it(tmp_path, tok, monkeypatch):
    cfg, _ = _setup(tmp_path, "jsonl")
    cfg["data"]["on_bad_record"] = "fail"
    bad = tmp_path / "corpus.jsonl"
    bad.write_text(bad.read_text() + '{"text": 5}\n')
    get_data(cfg["data"], tmp_path / "sources.json")
    with pytest.raises(Exception, match="not a string"):
        tokenize_job(cfg, str(tmp_path / "sources.json"), 0, tok, tmp_path / "job", 2, per_job=SHARDS)
    assert not list((tmp_path / "job").glob("*shard-*"))  # no shard that looks complete, no temporary file


def test_plan_warns_only_when_a_grouping_reads_a_compressed_source_again(tmp_path):
    from llmpipe.plan import decompress_warning

    source = _write("gz", tmp_path)
    d = {"sources": [source], "num_shards": 16, "shards_per_job": None}
    assert decompress_warning(d) is None  # one job reads it once
    warning = decompress_warning({**d, "shards_per_job": 4})
    assert "in 4 tokenize jobs" in warning and "corpus.jsonl.gz" in warning and "null" in warning


@pytest.mark.parametrize("bad", ["\\q", "\\ud800", "\x01"])
def test_a_bad_line_held_or_streamed_gives_the_same_shard(tmp_path, tok, monkeypatch, bad):
    """A bad JSON line just over HUGE_RECORD_BYTES: a one-shard job's strided scan holds it (its line end is
    in the block read), a job of all shards streams it; under on_bad_record: skip both name it with orjson's
    message, so the shard (its read metadata) is the same file whatever the grouping."""
    monkeypatch.setattr(limits, "HUGE_RECORD_BYTES", 4096)
    monkeypatch.setattr(limits, "STRIDE_BLOCK", 8192)
    monkeypatch.setattr(limits, "LINE_CHUNK", 1024)
    monkeypatch.setattr(limits, "HUGE_CHUNK", 1024)
    monkeypatch.setattr(limits, "LONG_STRING", 1000)  # its string streamed in segments
    source = tmp_path / "corpus.jsonl"
    lines = [json.dumps({"text": d[:900]}) for d in DOCS[:12]]  # held (and not long) on both paths
    lines[4] = '{"text": "' + "x" * 5000 + bad + '"}'  # record 4: shard 0 of 4
    source.write_text("\n".join(lines) + "\n")
    data = {"sources": [str(source)], "num_shards": 4, "on_bad_record": "skip"}
    cfg = tiny_config(tmp_path, data=data, tokenizer={"source": str(tok)})
    get_data(cfg["data"], tmp_path / "sources.json")
    names, listed = read_sources(str(tmp_path / "sources.json"))
    tokenize_shard(cfg, names, 0, tok, tmp_path / "alone.safetensors", sources_key=listed["key"])
    tokenize_job(cfg, str(tmp_path / "sources.json"), 0, tok, tmp_path / "job", 1, per_job=4)
    read = [
        json.loads(stfile.header(p)[0]["__metadata__"]["read"])
        for p in (tmp_path / "alone.safetensors", tmp_path / "job" / shard_name(0))
    ]
    assert read[0]["skipped_examples"] == read[1]["skipped_examples"] and "bad_json" in read[0]["skipped_examples"]
    assert (tmp_path / "alone.safetensors").read_bytes() == (tmp_path / "job" / shard_name(0)).read_bytes()


@pytest.mark.parametrize("kind", ["pretty", "one_line", "pretty_gz"])
@pytest.mark.parametrize("policy", ["skip", "fail"])
def test_a_json_array_source_is_refused_alike_by_every_shard_and_grouping(tmp_path, tok, kind, policy):
    """A JSON array beside a JSONL source, dealt record by record over 4 shards: every shard refuses the array
    whichever of its records it keeps (read whole, line by line or strided, never cut into byte ranges), so
    under skip the store is the same for one job of 4 shards and 4 jobs of 1, the array skipped once and no
    line of it counted or kept; under fail every job stops naming it. Before, only the shard keeping record 0
    saw the array: the others kept its last element and counted the rest as bad JSON."""
    from llmpipe.data.cuts import cut_files

    records = [{"text": f"array document number {i}"} for i in range(9)]
    body = json.dumps(records) if kind == "one_line" else "[\n" + ",\n".join(map(json.dumps, records)) + "\n]\n"
    array = tmp_path / ("corpus.json.gz" if kind.endswith("_gz") else "corpus.json")
    array.write_bytes(gzip.compress(body.encode()) if kind.endswith("_gz") else body.encode())
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS[:12]))
    data = {"sources": [str(array), str(good)], "num_shards": 4, "on_bad_record": policy, "range_split_bytes": 1}
    fingerprints = set()
    for per_job in (4, 1):  # one job of 4 shards; 4 jobs of 1 (each strided over the plain files)
        cfg = tiny_config(tmp_path, data={**data, "shards_per_job": per_job}, tokenizer={"source": tok})
        assert cut_files(cfg["data"], cfg["data"]["sources"], {}) == [str(good)]  # the array is read whole
        sources = tmp_path / f"sources-{per_job}.json"
        get_data(cfg["data"], sources)
        jobs = [tmp_path / f"tokens-{per_job}" / f"job-{j:05d}" for j in range(num_jobs(cfg["data"], n_sources=2))]
        assert len(jobs) == 4 // per_job
        if policy == "fail":
            for j, folder in enumerate(jobs):
                with pytest.raises(BadSource, match=rf"^{array}: is a JSON array, not JSON Lines"):
                    tokenize_job(cfg, str(sources), j, tok, folder, 1)
            continue
        for j, folder in enumerate(jobs):
            tokenize_job(cfg, str(sources), j, tok, folder, 1)
        out = tmp_path / f"tokens-{per_job}" / "manifest.json"
        token_store_main(["--shards", *map(str, jobs), "--sources", str(sources), "--out", str(out)])
        manifest = json.loads(out.read_text())
        read = manifest["read"]
        assert read["sources_skipped"] == {"unreadable_source": 1} and read["skipped_total"] == 0, per_job
        assert "is a JSON array" in read["sources_skipped_examples"]["unreadable_source"][str(array)]
        kept = sum(manifest["totals"][s]["documents"] for s in ("train", "val"))
        assert kept == read["documents"] == 12, per_job  # the JSONL source's documents only
        fingerprints.add(manifest["fingerprint"])
    assert len(fingerprints) == (1 if policy == "skip" else 0)
