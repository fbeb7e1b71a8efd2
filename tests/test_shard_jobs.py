"""Token-store shards grouped into tokenize jobs (data.shards_per_job): any shard count up to 1,000,000,
a job's shards written in parallel worker processes, and a store that does not depend on the grouping.
The Slurm side (N shards -> few sbatch calls, parallel inside one allocation) is in test_slurm.py."""

import contextlib
import json
import re
import subprocess
import sys

import pytest

from llmpipe import config as cfgmod
from llmpipe.data.token_store import build_manifest, shard_files
from llmpipe.data.tokenize import job_shards, num_jobs, shards_per_job, tokenize_job
from tests.conftest import REPO, corpus_docs, tiny_config, write_jsonl


@pytest.mark.parametrize(
    "shards,per_job", [(1, None), (64, None), (65, None), (10_000, None), (100_000, None), (7, 3), (100_001, 1000)]
)
def test_jobs_cover_every_shard_once(shards, per_job):
    d = {"num_shards": shards, "shards_per_job": per_job}
    covered = [i for j in range(num_jobs(d)) for i in job_shards(d, j)]
    assert covered == list(range(shards))
    assert per_job is not None or num_jobs(d) <= 64
    assert job_shards(d, num_jobs(d)) == range(0) and len(job_shards(d, 0)) == shards_per_job(d)


def test_config_takes_100000_shards(tmp_path):
    cfg = tiny_config(tmp_path, data={"num_shards": 100_000})
    assert cfg["data"]["num_shards"] == 100_000 and cfg["data"]["shards_per_job"] is None
    with pytest.raises(cfgmod.ConfigError, match="shards_per_job"):
        tiny_config(tmp_path, data={"shards_per_job": 0})


def test_job_folder_lists_shards_in_number_order(tmp_path):
    for i in (99_998, 100_000, 99_999, 100_001):
        (tmp_path / f"shard-{i:05d}.safetensors").touch()
    assert [f.name for f in shard_files([str(tmp_path)])] == [f"shard-{i:05d}.safetensors" for i in range(99_998, 100_002)]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty"):
        shard_files([str(tmp_path / "empty")])


def test_grouped_jobs_write_the_same_store_as_one_shard_a_job(tmp_path):
    from llmpipe.data.get_data import get_data
    from llmpipe.data.tokenizer import copy_tokenizer

    write_jsonl(tmp_path / "corpus.jsonl", corpus_docs(40))
    tok = tmp_path / "tok"
    copy_tokenizer(REPO / "data" / "tokenizers" / "gpt2", tok)
    stores = {}
    for per_job, threads in ((1, 1), (3, 2)):
        cfg = tiny_config(tmp_path, data={"num_shards": 5, "shards_per_job": per_job}, tokenizer={"source": str(tok)})
        get_data(cfg["data"], tmp_path / "sources.json")
        root = tmp_path / f"store-{per_job}"
        jobs = [root / f"job-{j:05d}" for j in range(num_jobs(cfg["data"]))]
        for j, folder in enumerate(jobs):
            tokenize_job(cfg, str(tmp_path / "sources.json"), j, str(tok), folder, threads)
        stores[per_job] = build_manifest(shard_files([str(f) for f in jobs]), root / "manifest.json")
    one, grouped = stores[1], stores[3]
    assert [e["file"] for e in grouped["shards"]] == [f"job-{i // 3:05d}/shard-{i:05d}.safetensors" for i in range(5)]
    assert grouped["fingerprint"] == one["fingerprint"] and grouped["totals"] == one["totals"]
    assert grouped["totals"]["train"]["tokens"] > 0
    for a, b in zip(one["shards"], grouped["shards"]):
        assert (tmp_path / "store-1" / a["file"]).read_bytes() == (tmp_path / "store-3" / b["file"]).read_bytes()


def _dry_run_jobs(tmp_path, data: dict) -> tuple[list[int], str]:
    over = tmp_path / "o.yaml"
    over.write_text(json.dumps({"results_dir": str(tmp_path / "r"), "data": data}))
    cmd = [sys.executable, "-m", "snakemake", "-n", "-p", "--profile", "profiles/local", "--configfile", str(over)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("rule tokenize:") == len(set(re.findall(r"tokens/job-(\d+)\b", proc.stdout)))
    return sorted({int(x) for x in re.findall(r"tokens/job-(\d+)\b", proc.stdout)}), proc.stdout


def test_dry_run_with_100000_shards_over_one_source_plans_one_reading_job(tmp_path):
    """Fewer sources than shards: every shard reads every source, so one job reads each source once
    for all of them (its threads encode); a given data.shards_per_job still groups as asked."""
    jobs, out = _dry_run_jobs(tmp_path, {"num_shards": 100_000})
    assert jobs == [0] and "--shards-per-job 100000" in out
    jobs, out = _dry_run_jobs(tmp_path, {"num_shards": 100_000, "shards_per_job": 1563})
    assert jobs == list(range(64)) and "--shards-per-job 1563" in out


def test_dry_run_with_more_sources_than_shards_plans_at_most_64_jobs(tmp_path):
    for i in range(130):
        write_jsonl(tmp_path / f"c{i:03d}.jsonl", corpus_docs(1))
    jobs, out = _dry_run_jobs(tmp_path, {"num_shards": 128, "sources": [str(tmp_path / "c*.jsonl")]})
    assert jobs == list(range(64)) and "--shards-per-job 2 " in out and "--threads 1 " in out


def dead_pid() -> int:
    from llmpipe.io import pid_running

    return next(p for p in range(4_000_000, 3_000_000, -1) if not pid_running(p))


def job_setup(tmp_path, docs=None):
    from llmpipe.data.get_data import get_data
    from llmpipe.data.tokenizer import copy_tokenizer

    write_jsonl(tmp_path / "corpus.jsonl", corpus_docs(40) if docs is None else docs)
    tok = tmp_path / "tok"
    copy_tokenizer(REPO / "data" / "tokenizers" / "gpt2", tok)
    cfg = tiny_config(tmp_path, data={"num_shards": 3, "shards_per_job": 3}, tokenizer={"source": str(tok)})
    get_data(cfg["data"], tmp_path / "sources.json")
    return cfg, tok


def test_a_rerun_drops_the_old_completion_mark_and_what_killed_runs_left(tmp_path, monkeypatch):
    """read.json marks a finished job (token-store refuses a folder without it): a rerun into the folder of
    a finished job, killed part way, left the old one beside a mix of new and old shards, which token-store
    took as complete. Temp shards and spool folders of killed runs are removed by the next run."""
    import llmpipe.data.tokenize as tokmod
    from llmpipe.data.token_store import job_reads

    cfg, tok = job_setup(tmp_path)
    folder = tmp_path / "job-00000"
    tokenize_job(cfg, str(tmp_path / "sources.json"), 0, str(tok), folder, 2)
    assert job_reads([folder])
    pid = dead_pid()
    left = [folder / f".shard-00001.safetensors.tmp-{pid}", folder / f".shard-00001.safetensors.tmp-{pid}.val.bin"]
    for f in left:
        f.write_bytes(b"partial")
    (folder / f".spool-{pid}-abc").mkdir()
    (folder / f".spool-{pid}-abc" / "doc").write_text("x")

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # a kill part way through the shards

    monkeypatch.setattr(tokmod, "write", killed)
    with pytest.raises(KeyboardInterrupt):
        tokenize_job(cfg, str(tmp_path / "sources.json"), 0, str(tok), folder, 2)
    with pytest.raises(ValueError, match="has no read.json .the job did not finish"):
        job_reads([folder])
    assert not any(f.exists() for f in left) and not (folder / f".spool-{pid}-abc").exists()


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("pool", [False, True])
def test_workers_die_with_a_killed_job(tmp_path, pool):
    """A tokenize job's workers (spawned processes) went on writing and renaming shards into its folder after
    the job was killed with SIGKILL (`daemon` covers only a normal exit). The workers are stopped (SIGSTOP)
    once ready, before the kill, so only the kernel's signal on the job's death can end them, however fast the machine.
    `pool`: a source a shard, so each worker reads its own shard (shard_pool) instead of one reader feeding them."""
    import os
    import signal
    import time

    import psutil

    big = " ".join(corpus_docs(400)) * 8  # ~12 MB a document: a worker that got past the stop is still encoding
    cfg, tok = job_setup(tmp_path, [big] * 6)
    if pool:
        from llmpipe.data.get_data import get_data

        cfg["data"]["sources"] = [str(write_jsonl(tmp_path / f"c{i}.jsonl", [big] * 2)) for i in range(3)]
        get_data(cfg["data"], tmp_path / "sources.json")
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    cmd = [sys.executable, "-m", "llmpipe", "tokenize", "--config", str(tmp_path / "cfg.json")]
    cmd += ["--sources", str(tmp_path / "sources.json"), "--job", "0", "--shards-per-job", "3", "--tokenizer", str(tok)]
    job = subprocess.Popen([*cmd, "--threads", "2", "--out", str(tmp_path / "job")], stderr=subprocess.PIPE, text=True)
    workers, seen = [], ""
    try:
        while len(workers) < 2:
            line = job.stderr.readline()
            assert line, seen
            seen += line
            for pid in re.findall(r"worker pid (\d+) ready", line):
                os.kill(int(pid), signal.SIGSTOP)
                workers.append(int(pid))
        job.kill()
        job.wait(10)
        deadline = time.time() + 2
        while any(psutil.pid_exists(w) and psutil.Process(w).status() != psutil.STATUS_ZOMBIE for w in workers):
            assert time.time() < deadline, f"workers {workers} outlived their killed job"
            time.sleep(0.05)
    finally:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert not list((tmp_path / "job").glob("shard-*")), "a shard was renamed into a killed job's folder"
    assert not (tmp_path / "job" / "read.json").exists()
