"""G4: a large plain JSONL source with fewer sources than shards is cut by get_data into one byte range per
shard at record starts (data.range_split_bytes); each tokenize job reads only its range. The store holds the
same documents with the same ids, validation split and skip locations as the record-index-modulo deal
(range_split_bytes: null); only the documents' order across shards differs. A file changed after get_data
stops the job naming it."""

import contextlib
import hashlib
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml
from safetensors import safe_open

from llmpipe import config as cfgmod
from llmpipe.data.get_data import get_data, load_sources
from llmpipe.data.readers import SourceChanged, opener
from llmpipe.data.sources import assign
from llmpipe.data.tokenize import tokenize_job, tokenize_shard
from llmpipe.data.tokenizer import copy_tokenizer
from tests.conftest import GPT2, REPO, REPO_IGNORE, corpus_docs, prepare, tiny_config

SHARDS = 5
SPLIT_AT = 4096  # bytes: big.jsonl is cut, small.jsonl (under it) keeps the modulo deal
BAD_LINES = (b'{"text": "unterminated\n', b'{"title": "no text field"}\n', b'{"text": "bad utf8 \xff"}\n')


def corpus_bytes() -> tuple[bytes, bytes]:
    """(big, small): paragraphs of the shipped sample as JSONL, big.jsonl with blank lines, a run of CRLF
    lines and three bad records; small.jsonl a few records (< SPLIT_AT bytes)."""
    paras = [p for d in corpus_docs(40) for p in d.split("\n\n") if p.strip()][:600]
    lines = []
    for i, p in enumerate(paras):
        lines.append(json.dumps({"text": p}).encode() + (b"\r\n" if 200 <= i < 260 else b"\n"))
        if i % 37 == 0:
            lines.append(b"  \t\n" if i % 2 else b"\r\n")  # blank: not a record
        if i in (100, 301, 450):
            lines.append(BAD_LINES[(100, 301, 450).index(i)])
    small = b"".join(json.dumps({"text": p}).encode() + b"\n" for p in paras[:8])
    assert len(small) < SPLIT_AT
    return b"".join(lines), small


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("ranges-data")
    big, small = corpus_bytes()
    (root / "big.jsonl").write_bytes(big)
    (root / "small.jsonl").write_bytes(small)
    return root


def config(tmp, corpus, split_at):
    return tiny_config(
        tmp,
        data={
            "sources": [str(corpus / "big.jsonl"), str(corpus / "small.jsonl")],
            "num_shards": SHARDS,
            "on_bad_record": "skip",
            "range_split_bytes": split_at,
        },
        tokenizer={"source": str(GPT2)},
    )


def store(tokens) -> dict:
    """doc id -> (split, token ids), per shard doc id order, and the skipped locations, from the shards."""
    docs, order, skipped, read = {}, [], set(), []
    for s in range(SHARDS):
        with safe_open(str(tokens / f"shard-{s:05d}.safetensors"), framework="numpy") as f:
            meta = json.loads(f.metadata()["read"])
            read.append(meta)
            skipped |= {loc.split(": ")[0] for shown in meta["skipped_examples"].values() for loc in shown}
            shard = []
            for split in ("train", "val"):
                offs, ids, toks = (
                    f.get_tensor(f"{split}.offsets"),
                    f.get_tensor(f"{split}.doc_ids"),
                    f.get_tensor(f"{split}.tokens"),
                )
                for i, did in enumerate(ids.tolist()):
                    docs[did] = (split, toks[offs[i] : offs[i + 1]].tolist())
                shard.extend(ids.tolist())
            order.append(shard)
    return {"docs": docs, "order": order, "skipped": skipped, "read": read}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    out = {}
    for name, split_at in (("ranges", SPLIT_AT), ("modulo", None)):
        tmp = tmp_path_factory.mktemp(name)
        res = prepare(tmp, config(tmp, corpus, split_at), views=())
        out[name] = {**res, **store(res["tokens"]), "sources_json": json.loads((tmp / "sources.json").read_text())}
    return out


def test_same_documents_split_and_skips_as_the_modulo_deal(runs, corpus):
    r, m = runs["ranges"], runs["modulo"]
    big, small = r["sources_json"]["sources"]
    assert len(big["ranges"]) == SHARDS + 1 and "ranges" not in small  # only the large file is cut
    assert all("ranges" not in e for e in m["sources_json"]["sources"])
    assert r["sources_json"]["key"] != m["sources_json"]["key"]  # the cut keys every later output

    assert r["docs"] == m["docs"]  # doc id -> (train/val, token ids): same documents, ids and split
    assert {d for d, (s, _) in r["docs"].items() if s == "val"}  # the split is not empty
    assert r["skipped"] == m["skipped"] == {f"{corpus / 'big.jsonl'}:{n}" for n in bad_line_numbers(corpus)}
    assert sum(x["skipped_total"] for x in r["read"]) == sum(x["skipped_total"] for x in m["read"]) == 3
    rm, mm = (json.loads(x["manifest"].read_text()) for x in (r, m))
    assert rm["totals"] == mm["totals"] and rm["by_source"] == mm["by_source"]
    assert r["order"] != m["order"]  # what differs: which shard holds a record of the cut file
    for s, ids in enumerate(r["order"]):  # shard s holds a contiguous run of big.jsonl's records
        first = big["ranges"][s][1]
        recs = sorted(i for i in ids if i >> 40 == 0)
        assert all(first <= i < big["ranges"][s + 1][1] for i in recs)
        assert all((i & (1 << 40) - 1) % SHARDS == s for i in ids if i >> 40 == 1)  # small.jsonl: still the modulo deal


def bad_line_numbers(corpus) -> list[int]:
    lines = (corpus / "big.jsonl").read_bytes().splitlines(keepends=True)
    return [n for n, line in enumerate(lines, 1) if line in BAD_LINES]


def test_each_job_reads_only_its_range(tmp_path, corpus, runs, monkeypatch):
    size = (corpus / "big.jsonl").stat().st_size
    longest = max(map(len, (corpus / "big.jsonl").read_bytes().splitlines(keepends=True)))
    # the recorded stats: bytes read of big.jsonl per shard, about size / shards each, summing to its size
    got = [x["bytes_read"] for x in runs["ranges"]["read"]]
    assert all(set(g) == {str(corpus / "big.jsonl")} for g in got)  # small.jsonl is not read by range
    per = [g[str(corpus / "big.jsonl")] for g in got]
    assert sum(per) == size
    assert all(abs(n - size / SHARDS) <= longest for n in per), (per, size, longest)
    assert all("bytes_read" not in x for x in runs["modulo"]["read"])  # the modulo deal's stats keep their form

    # the bytes actually pulled from the file by each tokenize job (a wrapped reader open)
    cfg = config(tmp_path, corpus, SPLIT_AT)
    key = get_data(cfg["data"], tmp_path / "sources.json")["key"]
    sources = load_sources(tmp_path / "sources.json")
    copy_tokenizer(str(GPT2), tmp_path / "tokenizer")
    opened = []
    real = opener._open_binary

    class Counting:
        def __init__(self, fh):
            self.fh, self.n = fh, 0

        def read(self, size=-1):
            data = self.fh.read(size)
            self.n += len(data)
            return data

        def seek(self, *a):
            return self.fh.seek(*a)

    @contextlib.contextmanager
    def counting(url):
        with real(url) as fh:
            c = Counting(fh)
            opened.append((url, c))
            yield c

    monkeypatch.setattr(opener, "_open_binary", counting)
    pulled = []
    for s in range(SHARDS):
        opened.clear()
        tokenize_shard(cfg, sources, s, tmp_path / "tokenizer", tmp_path / f"shard-{s}.safetensors", sources_key=key)
        (n,) = [c.n for url, c in opened if url.endswith("big.jsonl")]
        pulled.append(n)
        assert any(url.endswith("small.jsonl") and c.n == (corpus / "small.jsonl").stat().st_size for url, c in opened)
    assert pulled == per and max(pulled) < size / 2  # no job read the whole file


def test_each_range_has_its_sha256_from_its_one_read(tmp_path, corpus, runs):
    """The store lists the sha256 of each byte range as its job read it (and of a whole file); ranges left
    empty (more shards than records at a cut) are listed too."""
    big, small = (corpus / "big.jsonl").read_bytes(), (corpus / "small.jsonl").read_bytes()
    cuts = [r[0] for r in runs["ranges"]["sources_json"]["sources"][0]["ranges"]]
    manifest = json.loads(runs["ranges"]["manifest"].read_text())
    assert manifest["source_sha256"] == {
        str(corpus / "big.jsonl"): [[a, b, hashlib.sha256(big[a:b]).hexdigest()] for a, b in zip(cuts, cuts[1:])],
        str(corpus / "small.jsonl"): hashlib.sha256(small).hexdigest(),
    }
    # the model card's one value for a cut file: `ranges:` + the sha256 of its ranges' sha256s in order
    from llmpipe.hub.card import _checksum

    joined = "".join(hashlib.sha256(big[a:b]).hexdigest() for a, b in zip(cuts, cuts[1:]))
    assert (
        _checksum(manifest["source_sha256"][str(corpus / "big.jsonl")]) == "ranges:" + hashlib.sha256(joined.encode()).hexdigest()
    )
    assert _checksum(manifest["source_sha256"][str(corpus / "small.jsonl")]) == hashlib.sha256(small).hexdigest()
    three = tmp_path / "three.jsonl"
    three.write_bytes(b"".join(json.dumps({"text": t}).encode() + b"\n" for t in ("a b", "c d", "e f")))
    cfg = tiny_config(
        tmp_path, data={"sources": [str(three)], "num_shards": SHARDS, "range_split_bytes": 1}, tokenizer={"source": str(GPT2)}
    )
    get_data(cfg["data"], tmp_path / "sources.json")
    copy_tokenizer(str(GPT2), tmp_path / "tokenizer")
    tokenize_job(cfg, str(tmp_path / "sources.json"), 0, tmp_path / "tokenizer", tmp_path / "job", 1, per_job=SHARDS)
    cuts = [r[0] for r in json.loads((tmp_path / "sources.json").read_text())["sources"][0]["ranges"]]
    assert len(set(cuts)) < len(cuts)  # some ranges are empty
    got = json.loads((tmp_path / "job" / "read.json").read_text())["sha256"]
    data = three.read_bytes()
    assert sorted(got) == sorted([0, a, b, hashlib.sha256(data[a:b]).hexdigest()] for a, b in set(zip(cuts, cuts[1:]))), got


def test_below_the_threshold_nothing_changes(tmp_path, corpus):
    """The default threshold (256 MiB) leaves the test corpus whole: sources.json as with splitting off (the
    store's bytes then are today's: pinned by test_data_identity.py)."""
    outs = []
    for split_at in ("default", None):
        cfg = config(tmp_path / str(split_at), corpus, None)
        if split_at == "default":
            cfg = tiny_config(tmp_path, data={k: v for k, v in cfg["data"].items() if k != "range_split_bytes"})
            assert cfg["data"]["range_split_bytes"] == 256 << 20
        (tmp_path / str(split_at)).mkdir()
        get_data(cfg["data"], tmp_path / str(split_at) / "sources.json")
        outs.append((tmp_path / str(split_at) / "sources.json").read_bytes())
        plan = assign(load_sources(tmp_path / str(split_at) / "sources.json"), SHARDS, 1)
        assert plan.ranges == () and plan.reading(0) == (plan.keep, (1, SHARDS), None)
    assert outs[0] == outs[1] and b'"ranges"' not in outs[0]


@pytest.mark.parametrize("change", ["append", "truncate"])
def test_file_changed_after_get_data_fails_naming_it(tmp_path, corpus, change):
    big = tmp_path / "big.jsonl"
    shutil.copyfile(corpus / "big.jsonl", big)
    shutil.copyfile(corpus / "small.jsonl", tmp_path / "small.jsonl")
    cfg = config(tmp_path, tmp_path, SPLIT_AT)
    key = get_data(cfg["data"], tmp_path / "sources.json")["key"]
    sources = load_sources(tmp_path / "sources.json")
    copy_tokenizer(str(GPT2), tmp_path / "tokenizer")
    data = big.read_bytes()
    big.write_bytes(data + b'{"text": "one more"}\n' if change == "append" else data[: len(data) // 2])
    with pytest.raises(SourceChanged, match=rf"data source {big} changed after get-data"):
        tokenize_shard(cfg, sources, 3, tmp_path / "tokenizer", tmp_path / "s.safetensors", sources_key=key)
    assert not (tmp_path / "s.safetensors").exists()


def test_snakemake_store_with_ranges_totals_equal_the_modulo_run(tmp_path, corpus):
    work = tmp_path / "repo"
    shutil.copytree(REPO, work, ignore=REPO_IGNORE, symlinks=True)
    shutil.copyfile(corpus / "big.jsonl", work / "big.jsonl")
    shutil.copyfile(corpus / "small.jsonl", work / "small.jsonl")
    totals = {}
    for run, split_at in (("ranges", SPLIT_AT), ("modulo", None)):
        over = {
            "run": run,
            "data": {
                "sources": ["big.jsonl", "small.jsonl"],
                "num_shards": SHARDS,
                "on_bad_record": "skip",
                "val_fraction": 0.1,
                "range_split_bytes": split_at,
            },
            "tokenizer": {"source": str(GPT2)},
        }
        (work / f"{run}.yaml").write_text(yaml.safe_dump(over))
        target = f"results/{run}/data/stats.json"  # through verify_data: it re-reads the shards' byte ranges
        proc = subprocess.run(
            [sys.executable, "-m", "snakemake", target, "--profile", "local", "--cores", "1", "--configfile", f"{run}.yaml"],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        manifest = json.loads((work / f"results/{run}/data/tokens/manifest.json").read_text())
        sources = json.loads((work / f"results/{run}/data/sources.json").read_text())["sources"]
        assert ("ranges" in sources[0]) == (split_at is not None)
        totals[run] = (manifest["totals"], manifest["by_source"], manifest["read"]["skipped"])
        big, small = ((work / f).stat().st_size for f in ("big.jsonl", "small.jsonl"))
        reads = manifest["source_reads"]  # get-data's pass over a file it cuts into ranges is counted: x2.0 for it
        assert reads["get_data_bytes"] == (big if split_at is not None else 0)
        assert reads["bytes_read"] == reads["source_bytes"] + reads["get_data_bytes"] == big + small + reads["get_data_bytes"]
        if split_at is not None:
            assert manifest["read"]["bytes_read"] == {"big.jsonl": big}
            assert reads["not_read_once"] == {"big.jsonl": {"size": big, "bytes_read": 2 * big}}
    assert totals["ranges"] == totals["modulo"]
    # get-data again, the file unchanged: the cut comes from its cache, no byte read
    with contextlib.chdir(work):
        cfg = cfgmod.validate(yaml.safe_load((work / "ranges.yaml").read_text()))
        again = get_data(cfg["data"], work / "results/ranges/data/sources.json")
    assert again["scanned"] == {} and "ranges" in again["sources"][0]
    assert np.sum([t["documents"] for t in totals["ranges"][0].values()]) > 0


@pytest.mark.parametrize("ends", ["\n", "\r\n", "\r"])
def test_split_points_stream_a_huge_line(tmp_path, monkeypatch, ends):
    """A line longer than HUGE_RECORD_BYTES (a record, and one of blanks only) is classified as it streams,
    not held: the same cuts as holding it (record indices, line numbers, offsets), and every cut a record
    start. Before, get-data held such a line and copied it once per block read (quadratic time)."""
    from llmpipe.data.readers import jsonl, limits
    from llmpipe.data.readers.jsonl import split_points

    lines = [json.dumps({"text": d}) for d in corpus_docs(40)]
    lines[7] = json.dumps({"text": "long " * 3000})  # 15 KB
    lines[21] = " " * 9000  # blank: no record
    lines[30] = json.dumps({"text": "x" * 20000})
    path = tmp_path / "c.jsonl"
    path.write_bytes(("\ufeff" + ends.join(lines) + ends).encode())
    whole = split_points(str(path), 16)
    monkeypatch.setattr(limits, "STRIDE_BLOCK", 1024)
    monkeypatch.setattr(limits, "HUGE_RECORD_BYTES", 4096)
    streamed_lines = []

    class Counted(jsonl.HugeLine):
        def __init__(self, head, fh, size):
            streamed_lines.append(len(head))
            super().__init__(head, fh, size)

    monkeypatch.setattr(jsonl, "HugeLine", Counted)
    streamed = split_points(str(path), 16)
    assert streamed == whole and len(streamed_lines) >= 3 and max(streamed_lines) <= 4096 + 1024  # held: <= a block more
    data = path.read_bytes()
    starts = {0} | {m + len(ends) for m in range(len(data)) if data.startswith(ends.encode(), m)}
    assert all(at in starts or at == len(data) for at, _, _ in whole)
