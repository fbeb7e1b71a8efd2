"""The benchmark scripts themselves, each run whole at its smallest size, so that none rots unnoticed (one
did: data_prep.py's symlinked corpus copies were refused once get-data refused a file listed twice).

The figures at these sizes are not the targets (fixed costs dominate a 2 MB corpus); what is checked is
that every script runs to its end and that what it prints holds together: the rows it promises, token
counts that agree across backends and scales, bytes read equal to the source size where one read is the
claim. The GPU scripts run their CPU checks (--cpu-smoke, --tiny) with no GPU visible (CUDA_VISIBLE_DEVICES
empty), whatever the machine. data_prep.py compiles src/llmpipe's bytecode in place (as .ci/run does).
benchmarks/default_run.py (the whole default run, ~3 min) and neuron_shard_memory.py (a 1 B model;
tests/test_neuron_memory.py runs its measurement on small models) are not run here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from llmpipe.data.tokenize import num_jobs
from tests.conftest import CORPUS, REPO

pytestmark = pytest.mark.benchmarks
BENCH = REPO / "benchmarks"


def bench(script: str, *args: str, tmp_path, python: str = sys.executable, timeout: int = 600) -> str:
    """Run benchmarks/`script` with its temporary files under tmp_path; its standard output."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO / "src"), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [python, str(BENCH / script), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def percent(out: str, label: str) -> int:
    m = re.search(re.escape(label) + r"[^\n]*?: (-?\d+)% \(rounds: (-?\d+)%\)", out)
    assert m, f"no '{label}' ratio in:\n{out}"
    assert m[1] == m[2], "one round: the median is that round"
    return int(m[1])


def test_data_prep_prints_every_ratio_of_the_per_token_targets(tmp_path):
    """data_prep.py on the shipped sample standing in for the chunks corpus, --scale 2: both paths, the
    recipe, the encoders alone and the floor; the x2 store holds twice the x1 tokens."""
    shared = tmp_path / "shared"
    (shared / "corpus").mkdir(parents=True)
    shutil.copyfile(CORPUS, shared / "corpus" / "gutenberg-chunks-100mb.jsonl.gz")
    out = bench(
        "data_prep.py", "--corpora", "chunks", "--shared", str(shared), "--scale", "2", "--tmp", str(tmp_path), tmp_path=tmp_path
    )
    for row in ("seeds' recipe", "llmpipe (tiktoken)", "tiktoken alone, 2 procs", "llmpipe (HF tokenizer only)"):
        assert re.search(rf"^{re.escape(row)} +\d+\.\d s +\d+\.\d+ M tok/s", out, re.M), f"no row '{row}':\n{out}"
    stages = re.findall(
        r"get-data\+tokenizer [\d.]+ \([\d.]+\), tokenize [\d.]+ \([\d.]+\), token-store [\d.]+ \([\d.]+\), pack", out
    )
    assert len(stages) == 4, out  # x1 both paths, x2 both paths
    assert re.search(r"x2 vs x1: time [\d.]+x, tokens 2\.00x", out), out
    for label in (
        "llmpipe x2 end to end over tiktoken alone x2",
        "... to the token store",
        "... the tokenize step alone",
        "... over tiktoken alone x2 making our call",
        "llmpipe HF path x2 end to end over encode_batch_fast alone x2",
    ):
        assert percent(out, label) > 0
    m = re.search(r"pack wrote ([\d.]+) GB", out)
    assert m and float(m[1]) > 0, out


def test_stream_memory_measures_every_input_kind_at_two_sizes(tmp_path):
    """stream_memory.py at 1 MB: a row per input kind, the ratio of its two peaks, the long paragraph and
    the strided scan's long record read as streams, the same records from every container."""
    out = bench("stream_memory.py", "--mb", "1", "--corpus", str(CORPUS), tmp_path=tmp_path)
    rows = {m[1]: m for m in re.finditer(r"^ *(\S+) +1 +(\d+)M +(\d+)M +([\d.]+) +([\d,]+) +(\d+) +[\d.]+$", out, re.M)}
    kinds = ("jsonl", "jsonl.gz", "jsonl.zst", "paragraph", "parquet", "hf-parquet", "hf-saved", "hf-jsonl", "strided")
    assert set(rows) == set(kinds), out
    for kind, m in rows.items():
        assert abs(float(m[4]) - int(m[3]) / int(m[2])) < 0.05, f"{kind}: ratio {m[4]} is not 10x peak / 1x peak"
        assert int(m[5].replace(",", "")) > 0
        assert int(m[6]) == (kind in ("paragraph", "strided")), f"{kind}: streamed documents {m[6]}"
    # the same records, whatever the container
    assert len({rows[k][5] for k in ("jsonl", "jsonl.gz", "jsonl.zst", "parquet", "hf-parquet", "hf-saved", "hf-jsonl")}) == 1, (
        out
    )


def test_shard_reads_reads_each_byte_once_and_the_baseline_once_per_shard(tmp_path):
    """shard_reads.py on the shipped sample, 2 and 4 shards: one read of the source per store (x1.0), the
    one-job-per-shard baseline x4.0, and the 4-shard stores identical across the two groupings."""
    out = bench("shard_reads.py", "--source", str(CORPUS), "--shards", "2", "4", "--repeat", "1", tmp_path=tmp_path)
    reads = re.findall(
        r"^(one read per job \(default\)|baseline: one job per shard) +(\d+) shards.*bytes read / source: ([\d.]+)$", out, re.M
    )
    assert [(who.split()[0], int(n), float(r)) for who, n, r in reads] == [
        ("one", 2, 1.0),
        ("one", 4, 1.0),
        ("baseline:", 4, 4.0),
    ], out
    assert "the 4-shard stores are identical across groupings and rounds: True" in out


def test_shard_throughput_and_dry_run_group_shards_into_the_jobs_the_dag_makes(tmp_path):
    """shard_throughput.py (a real local run) and dry_run_shards.py (snakemake -n): the tokenize jobs each
    ran or listed are those llmpipe's grouping makes for as many sources as shards (at most MAX_AUTO_JOBS,
    what both scripts set data.shards_per_job to stand for)."""

    def grouped(shards: int) -> int:
        return num_jobs({"num_shards": shards, "shards_per_job": None}, n_sources=shards)

    out = bench("shard_throughput.py", "--shards", "8", "--baseline-shards", "4", tmp_path=tmp_path)
    ran = re.findall(r"(grouped|one shard a job \(baseline\)): +(\d+) shards in +(\d+) jobs", out)
    expected = [("grouped", 8, grouped(8)), ("one shard a job (baseline)", 4, 4)]
    assert [(who, int(s), int(j)) for who, s, j in ran] == expected, out
    out = bench("dry_run_shards.py", "--shards", "100", "--repeat", "1", "--no-baseline", tmp_path=tmp_path)
    m = re.search(r"100 shards: [\d.]+ s, peak RSS [\d.]+ GB, (\d+) tokenize jobs", out)
    assert m and int(m[1]) == grouped(100), out


def test_verify_memory_checks_every_view_at_twice_the_data(tmp_path):
    out = bench("verify_memory.py", "--copies", "2", tmp_path=tmp_path)
    one, two = (json.loads(re.search(rf"^{label} (\{{.*\}})$", out, re.M)[1]) for label in ("1x", "2x"))
    assert two["tokens"] == 2 * one["tokens"]
    for size in (one, two):  # every view checked, each split (the copies are sources of their own: other val picks)
        assert all(size["checked"][view][split] > 0 for view in ("hf", "litgpt", "megatron") for split in ("train", "val"))
    assert re.search(r"verify: time [\d.]+ s -> [\d.]+ s \(x[\d.]+\); peak RSS", out), out


def test_evaluate_memory_scores_the_same_loss_both_ways(tmp_path):
    out = bench("evaluate_memory.py", "--layers", "1", "--rows", "1", "--seq", "16", tmp_path=tmp_path)
    losses = re.findall(r"^(whole|streamed) +grew [\d.]+ GB .* val_loss ([\d.]+)$", out, re.M)
    assert [mode for mode, _ in losses] == ["whole", "streamed"] and losses[0][1] == losses[1][1], out
    assert "losses equal: True" in out


def test_long_document_gives_the_same_tokens_on_both_backends_and_formats(tmp_path):
    out = bench("long_document.py", "--sizes", "1", "--backend", "tiktoken", "hf", "--kind", "jsonl", "txt", tmp_path=tmp_path)
    rows = re.findall(r"^ +1MB +(jsonl|txt) +(tiktoken|hf) +piecewise +[\d.]+ +[\d.]+ +[\d.]+ +([\d,]+) +[\d.]+G$", out, re.M)
    assert {(k, b) for k, b, _ in rows} == {(k, b) for k in ("jsonl", "txt") for b in ("tiktoken", "hf")}, out
    assert len({t for _, _, t in rows}) == 1, f"token counts differ:\n{out}"


def test_gpu_benchmarks_check_themselves_on_cpu(tmp_path):
    """torch_gpu_throughput.py --cpu-smoke (2 gloo processes, every mode) and loss_kernel.py (no GPU: says
    so); on a GPU machine, run by hand, both measure."""
    out = bench("torch_gpu_throughput.py", "--cpu-smoke", "--timeout", "180", tmp_path=tmp_path)  # a hung case fails
    cases = re.findall(r"^tiny (minimal|ddp|fsdp2) +seq \d+ .*masking (on|off) +(\d+) tok/s/GPU", out, re.M)
    assert {c[0] for c in cases} == {"minimal", "ddp", "fsdp2"} and all(int(c[2]) > 0 for c in cases), out
    assert "no CUDA GPU available" in bench("loss_kernel.py", tmp_path=tmp_path)


def test_colossal_benchmark_checks_itself_on_cpu(tmp_path):
    from tests.test_colossal import VENV_PY, need_env

    need_env()
    out = bench("colossal_gpu_throughput.py", "--tiny", "--timeout", "180", tmp_path=tmp_path, python=str(VENV_PY))
    cases = re.findall(r"^tiny (\S+) +(\d+) tok/s/GPU", out, re.M)
    assert {c[0] for c in cases} >= {"ddp", "torch"} and all(int(c[1]) > 0 for c in cases), out
