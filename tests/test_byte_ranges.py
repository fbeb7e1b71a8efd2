"""G4: a large plain JSONL source with fewer sources than shards is cut by get_data into one byte range per
shard at line starts (data.range_split_bytes), reading only from each cut's target to the next line end; each
tokenize job reads only its range. Its documents are identified by their lines' byte offsets: the store holds
the same documents and skips as the record-index-modulo deal (range_split_bytes: null), under those ids, and the
same ids and validation split for any shard count. A file changed after get_data stops the job naming it."""

import contextlib
import hashlib
import json
import random
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml
from safetensors import safe_open

from llmpipe import config as cfgmod
from llmpipe.data.get_data import get_data, load_sources
from llmpipe.data.readers import BadSource, ReadStats, SourceChanged, documents, opener
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


def config(tmp, corpus, split_at, shards=SHARDS):
    return tiny_config(
        tmp,
        data={
            "sources": [str(corpus / "big.jsonl"), str(corpus / "small.jsonl")],
            "num_shards": shards,
            "on_bad_record": "skip",
            "range_split_bytes": split_at,
        },
        tokenizer={"source": str(GPT2)},
    )


def store(tokens, shards=SHARDS) -> dict:
    """doc id -> (split, token ids), per shard doc id order, and the skipped locations, from the shards."""
    docs, order, skipped, read = {}, [], set(), []
    for s in range(shards):
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
    for name, split_at, shards in (("ranges", SPLIT_AT, SHARDS), ("modulo", None, SHARDS), ("ranges3", SPLIT_AT, 3)):
        tmp = tmp_path_factory.mktemp(name)
        res = prepare(tmp, config(tmp, corpus, split_at, shards), views=())
        out[name] = {**res, **store(res["tokens"], shards), "sources_json": json.loads((tmp / "sources.json").read_text())}
    return out


def records_of(data: bytes) -> list[tuple[int, int]]:
    """(byte offset, line number) of each record (a line not blank) of a JSONL file, by universal newlines."""
    out, at = [], 0
    for n, line in enumerate(data.splitlines(keepends=True), 1):
        if line.strip():
            out.append((at, n))
        at += len(line)
    return out


def test_same_documents_and_skips_as_the_modulo_deal_under_offset_ids(runs, corpus):
    r, m = runs["ranges"], runs["modulo"]
    big, small = r["sources_json"]["sources"]
    assert len(big["ranges"]) == SHARDS + 1 and "ranges" not in small  # only the large file is cut
    assert all("ranges" not in e for e in m["sources_json"]["sources"])
    assert r["sources_json"]["key"] != m["sources_json"]["key"]  # the cut keys every later output

    data = (corpus / "big.jsonl").read_bytes()
    recs = records_of(data)  # record i of the modulo deal is the line at recs[i][0] in the cut file
    bad = set(bad_line_numbers(corpus))
    good = [(i, at) for i, (at, line) in enumerate(recs) if line not in bad]
    assert {d for d in r["docs"] if d >> 40 == 0} == {at for _, at in good}  # ids: the lines' byte offsets
    assert all(r["docs"][at][1] == m["docs"][i][1] for i, at in good)  # the same tokens for each record
    small_ids = {d for d in m["docs"] if d >> 40 == 1}
    assert {d: r["docs"][d] for d in small_ids} == {d: m["docs"][d] for d in small_ids}  # small.jsonl: as before
    assert {d for d, (s, _) in r["docs"].items() if s == "val"}  # the split is not empty
    assert r["skipped"] == {f"{corpus / 'big.jsonl'}:byte {at}" for at, line in recs if line in bad}
    assert m["skipped"] == {f"{corpus / 'big.jsonl'}:{n}" for n in bad}
    assert sum(x["skipped_total"] for x in r["read"]) == sum(x["skipped_total"] for x in m["read"]) == 3
    rm, mm = (json.loads(x["manifest"].read_text()) for x in (r, m))
    for man in (rm, mm):  # every document once, in train or val
        by_source = {k: sum(v[s]["documents"] for s in ("train", "val")) for k, v in man["by_source"].items()}
        assert by_source == {"0": len(good), "1": len(small_ids)}, by_source
    for s, ids in enumerate(r["order"]):  # shard s holds big.jsonl's records that start in its range
        assert all(big["ranges"][s] <= i < big["ranges"][s + 1] for i in ids if i >> 40 == 0)
        assert all((i & (1 << 40) - 1) % SHARDS == s for i in ids if i >> 40 == 1)  # small.jsonl: still the modulo deal


def test_offset_ids_and_split_do_not_depend_on_the_shard_count(runs):
    """Cut into 3 ranges or 5, the cut file's documents keep their ids and their train/val side."""
    five, three = runs["ranges"], runs["ranges3"]
    assert five["sources_json"]["sources"][0]["ranges"] != three["sources_json"]["sources"][0]["ranges"]
    cut = {d: v for d, v in five["docs"].items() if d >> 40 == 0}
    assert cut and cut == {d: v for d, v in three["docs"].items() if d >> 40 == 0}


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
    cuts = runs["ranges"]["sources_json"]["sources"][0]["ranges"]
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
    cuts = json.loads((tmp_path / "sources.json").read_text())["sources"][0]["ranges"]
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


def test_snakemake_store_with_ranges_holds_what_the_modulo_run_holds(tmp_path, corpus):
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
        both = {
            k: [sum(v[s][x] for s in ("train", "val")) for x in ("documents", "tokens")] for k, v in manifest["by_source"].items()
        }
        totals[run] = (both, manifest["read"]["skipped"], manifest["totals"]["val"]["documents"])
        big, small = ((work / f).stat().st_size for f in ("big.jsonl", "small.jsonl"))
        reads = manifest["source_reads"]  # get-data's reads to find the cuts are counted: about a line a cut
        longest = max(map(len, (work / "big.jsonl").read_bytes().splitlines()))
        assert (0 < reads["get_data_bytes"] <= 256 + (SHARDS - 1) * 2 * (longest + 256)) == (split_at is not None)
        assert reads["bytes_read"] == reads["source_bytes"] + reads["get_data_bytes"] == big + small + reads["get_data_bytes"]
        if split_at is not None:
            assert manifest["read"]["bytes_read"] == {"big.jsonl": big}  # the ranges tile the file
            assert reads["ratio"] < 1.1
    assert totals["ranges"][:2] == totals["modulo"][:2]  # documents and tokens by source, skips (the split: another sample)
    assert totals["ranges"][2] > 0 and totals["modulo"][2] > 0
    # get-data again, the file unchanged: the cut comes from its cache, no byte read
    with contextlib.chdir(work):
        cfg = cfgmod.validate(yaml.safe_load((work / "ranges.yaml").read_text()))
        again = get_data(cfg["data"], work / "results/ranges/data/sources.json")
    assert again["scanned"] == {} and "ranges" in again["sources"][0]
    assert np.sum([docs for docs, _ in totals["ranges"][0].values()]) > 0


def line_starts(data: bytes) -> list[int]:
    """Offsets where a line starts: 0, after an LF, after a CR that no LF follows (universal newlines)."""
    return [p for p in range(len(data) + 1) if p == 0 or data[p - 1] == 10 or data[p - 1] == 13 and data[p : p + 1] != b"\n"]


@pytest.mark.parametrize("ends", ["\n", "\r\n", "\r"])
def test_split_points_read_a_line_a_cut(tmp_path, monkeypatch, ends):
    """Each cut is the first line start at or after k * size / n, found by reading from there to the line's end
    only (reads growing from 256 bytes to CUT_READ: a 3 MB line crossing cuts is streamed, not held); a target
    inside the line the last cut passed reads nothing."""
    from llmpipe.data.readers import jsonl
    from llmpipe.data.readers.jsonl import split_points

    lines = [json.dumps({"text": d}) for d in corpus_docs(40)]
    lines[7] = json.dumps({"text": "long " * 3000})  # 15 KB
    lines[21] = " " * 9000  # blank: no record
    lines[30] = json.dumps({"text": "x" * (3 << 20)})  # over several cuts' targets
    path = tmp_path / "c.jsonl"
    data = ("\ufeff" + ends.join(lines) + ends).encode()
    path.write_bytes(data)
    searched = []

    class Watched:
        def search(self, buf, pos, end):
            searched.append(len(buf))
            return real.search(buf, pos, end)

    real = jsonl._LINE_START
    monkeypatch.setattr(jsonl, "_LINE_START", Watched())
    n = 64
    cuts, read = split_points(str(path), n)
    starts = line_starts(data)
    expect = [0]
    for k in range(1, n):
        expect.append(max(expect[-1], min(p for p in starts + [len(data)] if p >= k * len(data) // n)))
    assert cuts == expect + [len(data)]
    assert len(set(cuts)) < len(cuts)  # cuts inside the long line fall on its end
    assert max(searched) <= jsonl.CUT_READ + 1  # never the whole long line at once
    past = [c - k * len(data) // n for k, c in enumerate(cuts[1:-1], 1) if c > cuts[k - 1] or k == 1]  # read to find each
    assert sum(past) <= read < sum(past) + len(past) * jsonl.CUT_READ  # the rest of a line a cut, no more


def test_ranges_read_records_at_their_offsets(tmp_path):
    """Random JSONL (LF, CRLF, CR, blank lines, long lines streamed, a BOM): reading every range gives the records
    of the whole-file read, in order, each at the byte offset of its line."""
    import random

    from llmpipe.data.readers import jsonl, limits
    from llmpipe.data.sources import ByteRange

    rnd, path = random.Random(7), tmp_path / "r.jsonl"
    for trial in range(60):
        lines = []
        for _ in range(rnd.randint(1, 30)):
            kind = rnd.random()
            body = (
                " " * rnd.randint(0, 20)
                if kind < 0.1
                else json.dumps({"text": "w " * rnd.randint(1, 3000 if kind < 0.2 else 40)})
            )
            lines.append(body.encode() + rnd.choice([b"\n", b"\r\n", b"\r"]))
        data = (b"\xef\xbb\xbf" if trial % 5 == 0 else b"") + b"".join(lines)
        path.write_bytes(data)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(limits, "HUGE_RECORD_BYTES", 2048)  # the long lines come as streams (HugeLine) ...
            mp.setattr(limits, "LINE_CHUNK", 512)  # ... read 512 bytes at a time, so a line outgrows its chunk
            cuts, _ = jsonl.split_points(str(path), rnd.randint(2, 9))
            got = [
                (w.offset, v if isinstance(v, str) else "".join(v.chunks()))
                for a, b in zip(cuts, cuts[1:])
                for w, v in jsonl._jsonl(str(path), "text", part=ByteRange(a, b, len(data)), tally={})
            ]
            whole = [v if isinstance(v, str) else "".join(v.chunks()) for w, v in jsonl._jsonl(str(path), "text")]
        starts = line_starts(data)
        records = [a for a, b in zip(starts, starts[1:] + [len(data)]) if data[a:b].lstrip(b"\xef\xbb\xbf").strip()]
        assert [t for _, t in got] == whole and [at for at, _ in got] == records, trial


def test_a_sources_json_cut_by_record_index_is_refused_with_the_fix(tmp_path, corpus):
    """sources.json written before offsets identified a cut file's records ([offset, first record, first line]
    per range): tokenize would mix two identities in one store, so it stops naming the rerun."""
    from llmpipe.data.sources import split_source

    old = split_source(str(corpus / "big.jsonl"), [[0, 0, 1], [100, 3, 4], [200, 6, 8]], 200)
    with pytest.raises(ValueError, match=r"by index.*snakemake --forcerun get_data"):
        assign([old], 2, 0)


def test_snakemake_gives_a_cut_file_a_job_a_shard(tmp_path, corpus, runs):
    """Every source cut into byte ranges: the DAG makes a tokenize job per shard (each reads only its range, so
    the file is still read once), and the documents are the in-process cut run's: same ids, split, tokens."""
    work = tmp_path / "repo"
    shutil.copytree(REPO, work, ignore=REPO_IGNORE, symlinks=True)
    shutil.copyfile(corpus / "big.jsonl", work / "big.jsonl")
    over = {
        "run": "cut",
        "data": {
            "sources": ["big.jsonl"],
            "num_shards": SHARDS,
            "on_bad_record": "skip",
            "range_split_bytes": SPLIT_AT,
            "val_fraction": runs["ranges"]["cfg"]["data"]["val_fraction"],
        },
        "tokenizer": {"source": str(GPT2)},
    }
    (work / "cut.yaml").write_text(yaml.safe_dump(over))
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "results/cut/data/tokens/manifest.json", "--profile", "local", "--cores", "2"]
        + ["--configfile", "cut.yaml"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tokens = work / "results/cut/data/tokens"
    jobs = sorted(tokens.glob("job-*"))
    assert [sorted(p.name for p in j.glob("shard-*.safetensors")) for j in jobs] == [
        [f"shard-{s:05d}.safetensors"] for s in range(SHARDS)
    ]
    flat = tmp_path / "flat"
    flat.mkdir()
    for j in jobs:
        for f in j.glob("shard-*.safetensors"):
            (flat / f.name).symlink_to(f)
    got = store(flat)["docs"]
    assert got and got == {d: v for d, v in runs["ranges"]["docs"].items() if d >> 40 == 0}
    reads = json.loads((tokens / "manifest.json").read_text())["source_reads"]
    assert reads["bytes_read"] - reads["get_data_bytes"] == (work / "big.jsonl").stat().st_size  # the jobs: once
    again = subprocess.run(  # the cut's mark in get_data's params is stable: nothing reruns
        [sys.executable, "-m", "snakemake", "-n", "results/cut/data/tokens/manifest.json", "--profile", "local"]
        + ["--configfile", "cut.yaml"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, again.stdout[-2000:]


def test_a_mixture_samples_a_cut_file_by_the_offsets_tokenize_uses(tmp_path):
    """get-data's mixture plan hashes a cut file's documents by byte offset, as tokenize and verify do: the
    group keeps its planned bytes exactly (hashed by record index, it kept 10.7 % less)."""
    from llmpipe.data.verify_store import _shard_docs

    rng = random.Random(0)
    (tmp_path / "a.jsonl").write_bytes(
        b"".join(json.dumps({"text": f"doc {i} " + "w" * rng.randint(20, 200)}).encode() + b"\n" for i in range(4000))
    )
    (tmp_path / "b.jsonl").write_bytes(b"".join(json.dumps({"text": f"s{i} " + "v" * 100}).encode() + b"\n" for i in range(300)))
    groups = [{"path": str(tmp_path / f"{g}.jsonl"), "weight": 1, "name": g} for g in "ab"]
    d = tiny_config(tmp_path, data={"sources": groups, "num_shards": 4, "range_split_bytes": SPLIT_AT})["data"]
    made = get_data(d, tmp_path / "sources.json")
    assert all("ranges" in e for e in made["sources"])
    mix, sources = made["mixture"], load_sources(tmp_path / "sources.json")
    kept = [0, 0]
    for s in range(4):
        for did, text in _shard_docs(d, sources, s, mix):
            kept[did >> 40] += len(text.encode())
    assert kept == [g["bytes_kept"] for g in mix["groups"]] and 0 < kept[0] < mix["groups"][0]["bytes"]


@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_a_blank_file_is_not_cut_and_is_named_as_before(tmp_path, policy):
    """A file of blank lines over the threshold: get-data finds no record near the cuts, looks for one, and
    leaves it uncut, so its readers name it empty as for any file (before, each range gave 0 documents)."""
    (tmp_path / "blank.jsonl").write_bytes(b"   \n" * 5000)
    d = tiny_config(
        tmp_path,
        data={
            "sources": [str(tmp_path / "blank.jsonl")],
            "num_shards": 4,
            "range_split_bytes": SPLIT_AT,
            "on_bad_record": policy,
        },
    )["data"]
    made = get_data(d, tmp_path / "sources.json")
    assert "ranges" not in made["sources"][0]
    assert 20000 <= made["scanned"][str(tmp_path / "blank.jsonl")] < 20000 + 3 * 512  # the whole file, and near its cuts
    stats = ReadStats()
    if policy == "fail":
        with pytest.raises(BadSource, match="holds no records"):
            list(documents(str(tmp_path / "blank.jsonl"), d, stats))
    else:
        assert list(documents(str(tmp_path / "blank.jsonl"), d, stats)) == []
        assert "blank.jsonl" in str(stats.bad_sources["empty_source"])


def test_a_cut_file_read_under_max_records_is_refused(tmp_path, corpus):
    """max_records_per_source counts from a file's start: get-data cuts no file under it, and a sources.json
    cut without it is refused rather than read whole."""
    cfg = config(tmp_path, corpus, SPLIT_AT)
    get_data(cfg["data"], tmp_path / "sources.json")
    assert get_data({**cfg["data"], "max_records_per_source": 10}, tmp_path / "limited.json")["sources"][0].get("ranges") is None
    plan = assign(load_sources(tmp_path / "sources.json"), SHARDS, 0)
    keep, stride, part = plan.reading(0)
    with pytest.raises(ValueError, match="max_records_per_source does not allow: run get-data again"):
        list(documents(str(corpus / "big.jsonl"), {**cfg["data"], "max_records_per_source": 10}, ReadStats(), keep, stride, part))


def test_a_trained_tokenizer_leaves_out_the_cut_files_validation_documents(runs):
    """tokenizer.source: train reads a cut file as one range, so it leaves out the store's validation
    documents (offset ids), not another sample's (record indices: 22 of 23 val documents were trained on)."""
    from tokenizers import Tokenizer

    from llmpipe.data.tokenizer import _train_texts

    r = runs["ranges"]
    texts = list(_train_texts(r["cfg"]["data"], load_sources(r["root"] / "sources.json"), 10**9))
    tok = Tokenizer.from_file(str(GPT2 / "tokenizer.json"))
    trained = sorted(tuple(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
    stored = sorted(tuple(ids[:-1]) for split, ids in r["docs"].values() if split == "train")  # less the EOS
    assert len(stored) < len(r["docs"]) and trained == stored


@pytest.mark.parametrize(
    ("sources", "jobs"), [(["big.jsonl"], SHARDS), (["big.jsonl", "blank.jsonl"], 1), (["big.jsonl", "small.jsonl"], 1)]
)
def test_the_dag_gives_a_job_a_shard_only_when_get_data_cuts_every_source(tmp_path, corpus, sources, jobs):
    """A blank file is not cut (cuts.cut_files): with it, one job reads it once for all shards, not a job a
    shard each reading it whole."""
    work = tmp_path / "repo"
    shutil.copytree(REPO, work, ignore=REPO_IGNORE, symlinks=True)
    for name in ("big.jsonl", "small.jsonl"):
        shutil.copyfile(corpus / name, work / name)
    (work / "blank.jsonl").write_bytes(b"   \n" * 5000)
    data = {"sources": sources, "num_shards": SHARDS, "on_bad_record": "skip", "range_split_bytes": SPLIT_AT}
    (work / "x.yaml").write_text(yaml.safe_dump({"run": "x", "data": data, "tokenizer": {"source": str(GPT2)}}))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "results/x/data/tokens/manifest.json",
            "--profile",
            "local",
            "--configfile",
            "x.yaml",
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(rf"^tokenize\s+{jobs}$", proc.stdout, re.M), proc.stdout[-2000:]


def test_a_blank_file_in_a_mixture_is_named_by_get_data(tmp_path):
    """A mixture's count reads a cut file as one range; a blank file is not cut, so get-data still names it."""
    (tmp_path / "blank.jsonl").write_bytes(b"   \n" * 5000)
    (tmp_path / "a.jsonl").write_bytes(b"".join(json.dumps({"text": d}).encode() + b"\n" for d in corpus_docs(20)))
    groups = [{"path": str(tmp_path / f"{g}.jsonl"), "weight": 1, "name": g} for g in ("a", "blank")]
    d = tiny_config(tmp_path, data={"sources": groups, "num_shards": 4, "range_split_bytes": SPLIT_AT, "on_bad_record": "fail"})[
        "data"
    ]
    with pytest.raises(BadSource, match="blank.jsonl: holds no records"):
        get_data(d, tmp_path / "sources.json")
