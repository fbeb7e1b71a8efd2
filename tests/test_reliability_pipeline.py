"""The real Snakemake workflow on a tiny config (the shipped 2 MB corpus, a 2-layer model, 6 steps):

- secrets: with HF_TOKEN, HUGGING_FACE_HUB_TOKEN and AWS credentials set to canary values, no file
  under results/ or .snakemake/, no DAG / rule graph output and no report contains any of them;
- kill -9 of Snakemake and its jobs (the whole process group, as a lost node would) while a tokenize
  or a pack job is writing: nothing half-written carries an output's name, Snakemake lists the job
  as incomplete, and `snakemake --unlock` + the same command again gives outputs byte-identical to
  the clean run.
"""

import contextlib
import hashlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.conftest import REPO, REPO_IGNORE

pytestmark = pytest.mark.slow

SKIP = REPO_IGNORE
CANARIES = {
    "HF_TOKEN": "hf_CANARYhfTokenF9x1y2z3",
    "HUGGING_FACE_HUB_TOKEN": "hf_CANARYhubTokenF9q8w7",
    "AWS_ACCESS_KEY_ID": "AKIACANARYF9KEYID000",
    "AWS_SECRET_ACCESS_KEY": "CANARYsecretF9/accessKEY+abcdefghijklmnop",
    "AWS_SESSION_TOKEN": "CANARYsessionTokenF9FwoGZXIvYXdzE",
}
TINY = {
    "run": "t",
    "data": {
        "max_records_per_source": 200,
        "num_shards": 2,
        "val_fraction": 0.05,
        "views": ["hf", "litgpt"],
        "litgpt_sequences_per_file": 64,
    },
    "tokenizer": {"vocab_size": 512, "max_train_documents": 200},
    "model": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "train": {
        "seq_len": 64,
        "global_batch_size": 8,
        "micro_batch_size": 4,
        "max_steps": 6,
        "warmup_steps": 2,
        "save_interval": 3,
        "eval_interval": 3,
        "threads": 1,
    },
}
VIEWS = ("results/t/data/views/hf", "results/t/data/views/litgpt")


def copy_repo(root):
    work = root / "repo"
    shutil.copytree(REPO, work, ignore=SKIP)
    (work / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    return work


def snakemake(cwd, *args, env=None, timeout=600, popen=False):
    cmd = [sys.executable, "-m", "snakemake", *args, "--profile", "profiles/local", "--configfile", "tiny.yaml"]
    env = {**os.environ, **CANARIES, **(env or {})}
    if popen:
        return subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def digests(run):
    """sha256 of every data-stage file (logs and the views' log-like extras excluded; get_data's range cache
    records each source's inode and ctime, which differ between two copies by design)."""
    out = {}
    for p in sorted(run.rglob("*")):
        rel = p.relative_to(run).as_posix()
        if p.is_file() and rel.startswith(("data/", "tokenizer/")) and rel != "data/.sources-cuts.json":
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The whole workflow once, with canary credentials in the environment, plus its DAG and report."""
    work = copy_repo(tmp_path_factory.mktemp("clean"))
    proc = snakemake(work)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    texts = {"run stdout": proc.stdout, "run stderr": proc.stderr}
    for flag in ("--dag", "--rulegraph", "--d3dag"):
        p = snakemake(work, flag, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        texts[flag] = p.stdout + p.stderr
    p = snakemake(work, "--report", "report.html", timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    texts["report log"] = p.stdout + p.stderr
    return {"work": work, "texts": texts, "digests": digests(work / "results" / "t")}


def test_canary_credentials_appear_nowhere(clean):
    work = clean["work"]
    assert "digraph" in clean["texts"]["--dag"] and "train_torch" in clean["texts"]["--rulegraph"]
    assert (work / "report.html").stat().st_size > 10_000
    files = [p for d in ("results", ".snakemake") for p in (work / d).rglob("*") if p.is_file()]
    files.append(work / "report.html")
    assert len(files) > 40 and any(".snakemake/metadata" in str(p) for p in files)
    needles = [v.encode() for v in CANARIES.values()]
    found = [(str(p), n) for p in files for n in needles if n in p.read_bytes()]
    found += [(k, n) for k, t in clean["texts"].items() for n in needles if n.decode() in t]
    assert not found
    # the scan itself can fail: a canary written into a log is found
    probe = work / "results" / "t" / "logs" / "probe.log"
    probe.write_text(f"token={CANARIES['HF_TOKEN']}\n")
    assert any(CANARIES["HF_TOKEN"].encode() in p.read_bytes() for p in (work / "results").rglob("*.log"))
    probe.unlink()


def wait_for(pattern: str, root, proc, deadline_s=300):
    """Poll until a file/folder under `root` matches `pattern` (while Snakemake runs)."""
    rx = re.compile(pattern)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and proc.poll() is None:
        if root.exists() and any(rx.search(p.name) for p in root.rglob("*")):
            return True
        time.sleep(0.005)
    return False


def stage_running(group: int, command: str) -> bool:
    """Whether a process of this process group runs `command` (python -m llmpipe ...)."""
    import psutil

    for proc in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error):
            if os.getpgid(proc.pid) == group and proc.info["status"] != psutil.STATUS_ZOMBIE:
                if command in " ".join(proc.info["cmdline"] or []):
                    return True
    return False


@pytest.mark.parametrize("stage,seed", [("tokenize", 0), ("pack", 1)])
def test_kill_9_during_data_stage_then_rerun_is_byte_identical(clean, tmp_path, stage, seed):
    """From a copy of the clean run without the stage's outputs (so Snakemake reruns it and what follows)."""
    work = tmp_path / "repo"
    shutil.copytree(clean["work"], work, symlinks=True)
    run = work / "results" / "t"
    for rel in ["tokens", "views"] if stage == "tokenize" else ["views"]:
        shutil.rmtree(run / "data" / rel)
    watch, pattern = {
        "tokenize": (run / "data" / "tokens", r"^\.shard-\d{5}\.safetensors\.tmp-\d+"),
        "pack": (run / "data" / "views", r"^\.(hf|litgpt)\.tmp-\d+$"),
    }[stage]
    proc = snakemake(work, *VIEWS, popen=True)
    try:
        assert wait_for(pattern, watch, proc), f"never saw {stage} writing"
        time.sleep(random.Random(seed).uniform(0, 0.05))  # a seeded point inside (or just after) the write
        os.killpg(proc.pid, signal.SIGSTOP)  # frozen: whether the stage's job still runs cannot change
        interrupted = stage_running(proc.pid, f"llmpipe {stage}")  # its command
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # Snakemake and every job: nothing gets to clean up
        proc.wait()
    # The kill can land after the stage's last job ended (the data stages are fast, and so may the machine
    # be): then its outputs are whole, and it reruns only if Snakemake had not yet recorded the job's end.
    # A job killed while running must rerun: Snakemake marked it incomplete.
    if interrupted:
        assert (work / ".snakemake" / "incomplete").is_dir() and any((work / ".snakemake" / "incomplete").iterdir())
    else:  # every output the stage began is whole (its completion mark written)
        folders = (run / "data" / "tokens").glob("job-*") if stage == "tokenize" else (run / "data" / "views").glob("[!.]*")
        mark = "read.json" if stage == "tokenize" else "view.json"
        assert all((f / mark).is_file() for f in folders)
    # Nothing half-written carries an output's name: every shard file present is a whole safetensors
    # file whose tokens hash to what its metadata says, and no view folder lacks its view.json.
    from safetensors import safe_open

    for shard in (run / "data" / "tokens").rglob("shard-*.safetensors"):
        with safe_open(str(shard), framework="numpy") as f:
            meta = f.metadata()
            for split in ("train", "val"):
                assert hashlib.sha256(f.get_tensor(f"{split}.tokens").tobytes()).hexdigest() == meta[f"sha256.{split}"]
    for view in (run / "data" / "views").glob("[!.]*"):
        assert (view / "view.json").is_file(), view
    dry = snakemake(work, *VIEWS, "-n", "--unlock", timeout=120)  # the lock of the killed Snakemake
    assert dry.returncode == 0, dry.stderr[-2000:]
    dry = snakemake(work, *VIEWS, "-n", timeout=120)  # the killed stage is to run again
    rule = {"tokenize": "tokenize", "pack": "pack_view"}[stage]
    assert dry.returncode == 0 and (re.search(rf"^{rule}\s+\d+$", dry.stdout, re.M) or not interrupted), dry.stdout[-2000:]
    again = snakemake(work, *VIEWS)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert not [p for p in run.rglob(".*tmp-*")], "temporary files left behind"
    assert digests(run) == clean["digests"]
