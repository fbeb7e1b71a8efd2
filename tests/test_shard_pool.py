"""A tokenize job whose shards read no byte in common (whole sources dealt round-robin, or one file cut into
byte ranges) writes them in a pool of processes, each reading only its own shards' bytes (shard_pool): the
same shards and the same read.json (bytes read, sha256) as one process writing them all; an error in one
ends the job with none of its shards left. data.min_shards_per_job (the cluster profiles: their threads) sets the least shards a job holds."""

import functools
import json
import re
import signal
import subprocess
import sys

import pytest

import llmpipe.data.tokenize as tokmod
from llmpipe.data import stfile
from llmpipe.data.get_data import get_data, load_sources
from llmpipe.data.shard_pool import reads_apart
from llmpipe.data.tokenize import shards_per_job, tokenize_job
from llmpipe.data.tokenizer import copy_tokenizer
from tests.conftest import GPT2, REPO, corpus_docs, tiny_config, write_jsonl

SHARDS = 4


def setup(tmp_path, kind: str, bad: bool = False) -> dict:
    """whole: 7 files for 4 shards (uneven: 2, 2, 2, 1 sources a shard); cut: one file in 4 byte ranges;
    sparse: one file of 2 long lines in 4 ranges, some empty at one offset."""
    docs = [p for d in corpus_docs(30) for p in d.split("\n\n") if p.strip()][:400]
    if kind == "whole":
        sources = [write_jsonl(tmp_path / f"part-{i}.jsonl", docs[i::7]) for i in range(7)]
    elif kind == "cut":
        sources = [write_jsonl(tmp_path / "big.jsonl", docs)]
    else:
        sources = [write_jsonl(tmp_path / "big.jsonl", [" ".join(docs[:150]), " ".join(docs[150:])])]
    if bad:  # a broken record in the last source: the job stops under on_bad_record fail
        with open(sources[-1], "a") as fh:
            fh.write('{"text": "unterminated\n')
    data = {"sources": [str(s) for s in sources], "num_shards": SHARDS, "range_split_bytes": 4096, "on_bad_record": "fail"}
    cfg = tiny_config(tmp_path, data=data, tokenizer={"source": str(GPT2)})
    get_data(cfg["data"], tmp_path / "sources.json")
    copy_tokenizer(str(GPT2), tmp_path / "tok")
    return cfg


def job(tmp_path, cfg, name: str, threads: int):
    folder = tmp_path / name
    tokenize_job(cfg, str(tmp_path / "sources.json"), 0, str(tmp_path / "tok"), folder, threads, per_job=SHARDS)
    return folder


@pytest.mark.parametrize("kind", ["whole", "cut", "sparse"])
def test_a_pool_writes_the_shards_and_read_stats_of_one_process(tmp_path, kind, monkeypatch):
    cfg = setup(tmp_path, kind)
    sources = load_sources(tmp_path / "sources.json")
    assert reads_apart(sources, SHARDS, range(SHARDS))
    cuts = getattr(sources[0], "ranges", None)
    assert (kind != "whole") == bool(cuts) and (kind == "sparse") == (len(set(cuts or ())) < len(cuts or ()))
    one = job(tmp_path, cfg, "one", 1)

    def not_here(*args, **kwargs):  # the pool's processes import their own: only they may write
        raise AssertionError("the job's own process wrote shards")

    monkeypatch.setattr(tokmod, "write", not_here)
    pool = job(tmp_path, cfg, "pool", 3)
    tokens = []
    for s in range(SHARDS):
        name = f"shard-{s:05d}.safetensors"
        assert (one / name).read_bytes() == (pool / name).read_bytes(), name
        counts = json.loads(stfile.header(pool / name)[0]["__metadata__"]["counts"])
        tokens.append(counts["train"]["tokens"] + counts["val"]["tokens"])
    # every shard holds tokens, but for the sparse file's empty ranges (the file's 2 lines in 2 shards)
    assert sum(t > 0 for t in tokens) == (2 if kind == "sparse" else SHARDS), tokens
    read_one, read_pool = (json.loads((f / "read.json").read_text()) for f in (one, pool))
    assert read_pool == read_one
    size = sum(p.stat().st_size for p in tmp_path.glob("*.jsonl"))
    assert sum(read_pool["bytes_read"].values()) == size  # every byte once
    assert len(read_pool["sha256"]) == (7 if kind == "whole" else len(set(zip(cuts, cuts[1:]))))


def test_a_job_over_a_shared_source_keeps_its_one_reader(tmp_path):
    """Fewer sources than shards, not cut: every shard reads the whole source, so one process reads it."""
    write_jsonl(tmp_path / "corpus.jsonl", corpus_docs(5))
    cfg = tiny_config(tmp_path, data={"num_shards": SHARDS}, tokenizer={"source": str(GPT2)})
    get_data(cfg["data"], tmp_path / "sources.json")
    assert not reads_apart(load_sources(tmp_path / "sources.json"), SHARDS, range(SHARDS))


@pytest.mark.parametrize("kind", ["whole", "cut"])
def test_an_error_in_one_pool_process_leaves_no_shard(tmp_path, kind):
    cfg = setup(tmp_path, kind, bad=True)
    with pytest.raises(SystemExit, match=r"llmpipe tokenize: error: .*(part-6|big)\.jsonl"):
        job(tmp_path, cfg, "pool", 3)
    assert not list((tmp_path / "pool").glob("*shard-*")) and not (tmp_path / "pool" / "read.json").exists()


@pytest.mark.parametrize(
    "shards,sources,least,want", [(128, 130, None, 2), (128, 130, 32, 32), (16, 16, 32, 16), (10_000, 10_000, 32, 157)]
)
def test_a_job_gets_at_least_min_shards_per_job(shards, sources, least, want):
    assert shards_per_job({"num_shards": shards, "min_shards_per_job": least}, sources) == want
    assert shards_per_job({"num_shards": shards, "min_shards_per_job": least}, 1) == shards  # one source: one job
    assert shards_per_job({"num_shards": shards, "shards_per_job": 3, "min_shards_per_job": least}, sources) == 3


def test_dry_run_groups_by_min_shards_per_job_not_by_the_profiles_threads(tmp_path):
    """The cluster profiles set data.min_shards_per_job to their tokenize threads: a job a shard would use
    one of its 32. 130 sources, 128 shards, min 8: 16 jobs of 8 shards, not 64 of 2. The threads alone do
    not regroup (profiles that share a run, local and slurm-local, must plan the same jobs)."""
    for i in range(130):
        write_jsonl(tmp_path / f"c{i:03d}.jsonl", corpus_docs(1))
    planned = {}
    for least, threads in ((None, "8"), (8, "8"), (8, "1")):
        data = {"num_shards": 128, "sources": [str(tmp_path / "c*.jsonl")], "min_shards_per_job": least}
        over = tmp_path / "o.yaml"
        over.write_text(json.dumps({"results_dir": str(tmp_path / "r"), "data": {k: v for k, v in data.items() if v}}))
        cmd = [sys.executable, "-m", "snakemake", "-n", "-p", "--profile", "profiles/local", "--configfile", str(over)]
        proc = subprocess.run(
            [*cmd, "--cores", "8", "--set-threads", f"tokenize={threads}"], cwd=REPO, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        jobs = sorted({int(x) for x in re.findall(r"tokens/job-(\d+)\b", proc.stdout)})
        per_job = set(re.findall(r"--shards-per-job (\d+) ", proc.stdout))
        planned[least, threads] = (len(jobs), per_job)
        assert jobs == list(range(len(jobs))) and f"--threads {threads} " in proc.stdout
    assert planned == {(None, "8"): (64, {"2"}), (8, "8"): (16, {"8"}), (8, "1"): (16, {"8"})}


def big_job(tmp_path, shards: int) -> subprocess.Popen:
    """A tokenize job of `shards` whole sources of 2 documents of ~12 MB (seconds a shard), 2 processes."""
    big = " ".join(corpus_docs(400)) * 8
    sources = [str(write_jsonl(tmp_path / f"c{i}.jsonl", [big] * 2)) for i in range(shards)]
    cfg = tiny_config(tmp_path, data={"sources": sources, "num_shards": shards}, tokenizer={"source": str(GPT2)})
    get_data(cfg["data"], tmp_path / "sources.json")
    copy_tokenizer(str(GPT2), tmp_path / "tok")
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    cmd = [sys.executable, "-m", "llmpipe", "tokenize", "--config", str(tmp_path / "cfg.json"), "--sources"]
    cmd += [str(tmp_path / "sources.json"), "--job", "0", "--shards-per-job", str(shards), "--tokenizer", str(tmp_path / "tok")]
    # SIGINT as a terminal gives it: a shell running the suite in the background (CI) leaves it ignored
    sigint = functools.partial(signal.signal, signal.SIGINT, signal.SIG_DFL)
    out = ["--threads", "2", "--out", str(tmp_path / "job")]
    return subprocess.Popen([*cmd, *out], stderr=subprocess.PIPE, text=True, preexec_fn=sigint)


@pytest.mark.skipif(sys.platform != "linux", reason="signals as Linux sends them")
def test_an_interrupted_job_leaves_no_shard(tmp_path):
    """Ctrl-C (SIGINT) after a shard was written: the pool is stopped and the written shards removed too."""
    job = big_job(tmp_path, 4)
    seen = ""
    while "shard 0 written\n" not in seen and "shard 1 written\n" not in seen:
        line = job.stderr.readline()
        assert line, seen
        seen += line
    job.send_signal(signal.SIGINT)
    _, rest = job.communicate(timeout=120)
    assert job.returncode != 0 and "KeyboardInterrupt" in rest, rest[-2000:]
    assert not list((tmp_path / "job").glob("*shard-*")) and not (tmp_path / "job" / "read.json").exists()


@pytest.mark.skipif(sys.platform != "linux", reason="signals as Linux sends them")
def test_a_pool_process_killed_ends_the_job_naming_it(tmp_path):
    """A pool process killed (the OOM killer, an admin) must not leave the job waiting for its shard: the
    job ends at once naming it, stops the others and leaves no shard and no read.json."""
    import os
    import time

    job = big_job(tmp_path, 3)
    seen = ""
    while not (pids := re.findall(r"worker pid (\d+) ready", seen)):
        line = job.stderr.readline()
        assert line, seen
        seen += line
    for _ in range(600):  # until a process writes: then what the stopped one leaves is known
        if list((tmp_path / "job").glob(".shard-*.tmp-*")):
            break
        time.sleep(0.05)
    os.kill(int(pids[0]), signal.SIGKILL)
    _, rest = job.communicate(timeout=120)
    assert job.returncode == 1 and f"a tokenize process (pid {pids[0]}) ended without a word" in rest, rest[-2000:]
    assert not list((tmp_path / "job").glob("*shard-*")) and not (tmp_path / "job" / "read.json").exists()
