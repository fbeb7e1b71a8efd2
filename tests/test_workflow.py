"""The real Snakemake workflow on the embedded default, in a temp copy of the repository."""

import json
import os
import shutil
import subprocess
import sys

import datasets
import pytest
import torch

from tests.conftest import REPO, REPO_IGNORE

SKIP = REPO_IGNORE


def snakemake(cwd, *args, timeout=900, env=None):
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", "profiles/local", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    work = tmp_path_factory.mktemp("wf") / "repo"
    shutil.copytree(REPO, work, ignore=SKIP)
    return work


def test_dry_run_lists_every_stage(workdir):
    proc = snakemake(workdir, "-n", timeout=120)
    assert proc.returncode == 0, proc.stderr
    for rule in (
        "get_data",
        "tokenizer",
        "tokenize",
        "token_store",
        "pack_view",
        "verify_data",
        "init_model",
        "train_torch",
        "export_hf",
        "evaluate",
    ):
        assert f"rule {rule}:" in proc.stdout, rule
    assert proc.stdout.count("rule tokenize:") == 1  # one source, 2 shards: one job reads it once for both


def test_lint_is_clean():
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Lints for" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@pytest.mark.slow
def test_embedded_default_end_to_end(workdir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    proc = snakemake(workdir)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    run = workdir / "results" / "default"
    for rel in (
        "data/sources.json",
        "data/tokens/manifest.json",
        "data/views/hf/view.json",
        "data/stats.json",
        "tokenizer",
        "checkpoints/init/config.json",
        "checkpoints/torch/final/model.safetensors",
        "hf/model.safetensors",
        "hf/config.json",
        "hf/tokenizer.json",
        "eval.json",
        "train/metrics.jsonl",
        "logs/train_torch.log",
    ):
        assert (run / rel).exists(), rel

    recs = [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    first, last = (sum(r["loss"] for r in part) / 5 for part in (recs[:5], recs[-5:]))
    assert last < first - 1.0, (first, last)

    model = AutoModelForCausalLM.from_pretrained(run / "hf")
    tok = AutoTokenizer.from_pretrained(run / "hf")
    ids = tok("It was a dark and stormy night", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()

    ev = json.loads((run / "eval.json").read_text())
    last_val = [r for r in recs if "val_loss" in r][-1]
    assert abs(ev["val_loss"] - last_val["val_loss"]) < 1e-4
    assert ev["tokens"] == last_val["val_tokens"]
    val = datasets.load_from_disk(str(run / "data" / "views" / "hf" / "val")).with_format("torch")[:]
    assert ev["tokens"] == int((val["labels"][:, 1:] != -100).sum())
    assert abs(ev["perplexity"] - torch.exp(torch.tensor(ev["val_loss"])).item()) < 1e-3 * ev["perplexity"]

    stats = json.loads((run / "data" / "stats.json").read_text())
    assert stats["tokens"]["val"] == stats["views"]["hf"]["conservation"]["val"]["tokens_checked"]
    assert stats["read"]["documents"] == 400 and stats["tokenization"]["documents_retokenized"] > 0

    again = snakemake(workdir, "-n", timeout=120)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr

    # a data key only verify reads reruns verify alone; one only pack reads, pack on: never the steps before
    # (each data rule was given the whole data section: either retokenized the corpus)
    for setting, first in (("data={verify_sample: 32}", "verify_data"), ("data={shuffle_seed: 7}", "pack_view")):
        dry = snakemake(workdir, "-n", "--config", setting, timeout=120)
        assert dry.returncode == 0 and f"rule {first}:" in dry.stdout, dry.stdout[-2000:] + dry.stderr[-2000:]
        for rule in ("get_data", "tokenizer", "tokenize", "token_store") + (("pack_view",) if first == "verify_data" else ()):
            assert f"rule {rule}:" not in dry.stdout, (setting, rule)
    # a setting of a view this run does not build (litgpt's file size; views: [hf]) reruns nothing
    other = snakemake(workdir, "-n", "--config", "data={litgpt_sequences_per_file: 7}", timeout=120)
    assert other.returncode == 0 and "Nothing to be done" in other.stdout + other.stderr, other.stdout[-2000:]
    # how evaluate holds the weights reruns nothing; how many rows it scores reruns evaluate, never training
    streamed = snakemake(workdir, "-n", "--config", "eval={stream_weights: true}", timeout=120)
    assert streamed.returncode == 0 and "Nothing to be done" in streamed.stdout + streamed.stderr, streamed.stdout[-2000:]
    bounded = snakemake(workdir, "-n", "--config", "eval={final_max_batches: 1}", timeout=120)
    assert bounded.returncode == 0 and "rule evaluate:" in bounded.stdout, bounded.stdout[-2000:] + bounded.stderr[-2000:]
    assert "rule train_torch:" not in bounded.stdout and "rule export_hf:" not in bounded.stdout
    # settings that do not change the trained model rerun no training (nor export, evaluate): they reran it all
    neutral = "train={log_interval: 7, keep_checkpoints: 3, threads: 1, micro_batch_size: 2}"
    dry = snakemake(workdir, "-n", "--config", neutral, timeout=120)
    assert dry.returncode == 0 and "rule train_torch:" not in dry.stdout and "rule export_hf:" not in dry.stdout, dry.stdout[
        -3000:
    ]
    lr = snakemake(workdir, "-n", "--config", "train={lr: 0.0021}", timeout=120)  # one that does: refused at parse
    assert lr.returncode != 0 and "train.lr" in lr.stdout + lr.stderr, (lr.stdout + lr.stderr)[-2000:]

    # a retried training job: the failed attempt's output stays in logs/train_torch.attempts.log (Snakemake
    # removes a job's log before each run; the retry resumes the finished run's last step)
    marker = workdir / "failed-once"
    retried = snakemake(
        workdir, "--forcerun", "train_torch", "--retries", "1", env={"LLMPIPE_FAIL_ONCE": f"torch-train:{marker}"}
    )
    assert retried.returncode == 0 and marker.exists(), retried.stdout[-3000:] + retried.stderr[-3000:]
    history = (run / "logs" / "train_torch.attempts.log").read_text()
    assert history.count("== attempt started ") == 3  # the first run, the failed attempt, its retry
    failed, last = history.split("== attempt started ")[2:]
    assert "failing once on purpose" in failed and "resumed from" in last
    assert (run / "logs" / "train_torch.log").read_text() == "\n".join(last.split("\n")[1:])  # the log: this attempt's

    # a changed tokenizer in the same run folder stops before any job (run-identity.json), naming the way out
    (workdir / "smaller-vocab.yaml").write_text("tokenizer: {vocab_size: 2048}\n")
    refused = snakemake(workdir, "-n", "--configfile", "smaller-vocab.yaml", timeout=120)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "tokenizer.vocab_size 4096 -> 2048" in said, said[-2000:]
    assert "--config run=" in said
    # taken on purpose (the identity file removed), old tokens are never reused: everything from the tokenizer on reruns
    (run / "run-identity.json").unlink()
    changed = snakemake(workdir, "-n", "--configfile", "smaller-vocab.yaml", timeout=120)
    assert changed.returncode == 0, changed.stderr
    for rule in ("tokenizer", "tokenize", "token_store", "pack_view", "train_torch"):
        assert f"rule {rule}:" in changed.stdout, rule
    assert "rule get_data:" not in changed.stdout


def test_ddp_config_launches_torchrun_and_local_tokenizer_is_copied(workdir, tmp_path):
    overlay = tmp_path / "o.yaml"
    overlay.write_text(
        "run: ddp\ntrain: {threads: 1}\nparallel: {nproc_per_node: 2}\ntokenizer: {source: data/tokenizers/gpt2}\n"
    )
    proc = snakemake(workdir, "-n", "-p", "--configfile", str(overlay), timeout=120)
    assert proc.returncode == 0, proc.stderr
    launch = "python -m llmpipe launch --nproc-per-node 2 --nnodes 1 --launcher auto"
    assert f"{launch} --lock results/ddp/checkpoints/torch -- -m llmpipe torch-train" in proc.stdout
    # ... which runs torchrun --standalone outside Slurm
    cmd = subprocess.run(
        [sys.executable, *launch.split()[1:], "--dry-run", "--", "-m", "llmpipe", "torch-train"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},
    )
    assert cmd.stdout.split()[1:] == [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "llmpipe",
        "torch-train",
    ], cmd.stdout + cmd.stderr
    assert "data/tokenizers/gpt2/tokenizer.json" in proc.stdout  # tracked as the tokenizer rule's input
    assert "results/ddp/" in proc.stdout and "max_steps" in proc.stdout


@pytest.mark.slow
def test_plan_and_report_after_the_run(workdir):
    """After test_embedded_default_end_to_end (file order): the plan counted the packed view and
    matches what training did; an estimate from the corpus alone is close; the report shows the curves."""
    import base64

    from transformers import AutoModelForCausalLM

    run = workdir / "results" / "default"
    plan = json.loads((run / "plan.json").read_text())
    rows = json.loads((run / "data" / "views" / "hf" / "view.json").read_text())["train"]["rows"]
    assert plan["data"]["source"] == "packed view" and plan["data"]["train_rows"] == rows
    assert plan["model"]["parameters"] == AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "init").num_parameters()
    last = json.loads((run / "train" / "metrics.jsonl").read_text().splitlines()[-1])
    assert (plan["schedule"]["steps"], plan["schedule"]["tokens"]) == (last["step"], last["tokens"])
    assert abs(plan["schedule"]["epochs"] - last["epoch"]) < 1e-9
    assert "| p5.48xlarge |" in (run / "plan.md").read_text()

    est = subprocess.run(
        [sys.executable, "-m", "llmpipe", "plan", "--config", "config/config.yaml", "--estimate", "--out", "estimate.json"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert est.returncode == 0, est.stderr[-3000:]
    estimate = json.loads((workdir / "estimate.json").read_text())["data"]
    assert estimate["source"] == "estimate" and abs(estimate["train_rows"] - rows) <= 0.02 * rows, (estimate, rows)

    proc = snakemake(workdir, "--report", "report.html", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    html = (workdir / "report.html").read_text()
    for name in ("loss.png", "lr.png", "throughput.png"):  # the plots themselves, embedded
        assert base64.b64encode((run / "report" / name).read_bytes()).decode() in html, name
    for item in ("data.html", "plan.html", "eval.html"):
        assert item in html, item

    # no per-step metrics (the neuron backend writes none; sagemaker-train an empty file when no log line
    # matched) or a last step skipped as non-finite: the items are still made, saying what is missing
    from llmpipe import report

    inputs = {k: run / f for k, f in (("stats", "data/stats.json"), ("plan", "plan.json"), ("eval_json", "eval.json"))}
    recs = [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    skipped = {**recs[-1], "loss": None, "grad_norm": None}
    (workdir / "empty.jsonl").write_text("")
    (workdir / "skipped.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs[:-1] + [skipped]))
    for name, metrics, said in (
        ("missing", workdir / "none.jsonl", "not recorded"),
        ("empty", workdir / "empty.jsonl", "not recorded"),
        ("skipped", workdir / "skipped.jsonl", f"final train loss {recs[-2]['loss']:.4f}"),
    ):
        report.build(metrics, out_dir=workdir / name, **inputs)
        assert said in (workdir / name / "eval.html").read_text(), name
        assert all((workdir / name / f).stat().st_size > 0 for f in ("loss.png", "lr.png", "throughput.png")), name


def test_dry_run_with_remote_sources_makes_no_network_call(workdir, tmp_path):
    overlay = tmp_path / "remote.yaml"
    overlay.write_text("run: remote\ndata: {sources: ['s3://no-such-bucket/train.{1..4}.jsonl.gz']}\n")
    proc = snakemake(workdir, "-n", "--configfile", str(overlay), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "rule get_data:" in proc.stdout
