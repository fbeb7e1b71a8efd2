"""A real single-node Slurm cluster (scripts/slurm-local-start.sh): the pipeline with every job through
sbatch, a failing job retried, a training job killed by scancel resuming bit-exactly, 1 node x 2
processes through srun + torchrun, impossible requests refused at submit, the cluster profiles'
resources. Every snakemake call runs under `timeout -k`."""

import collections
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from llmpipe.dag import dry_run_jobs  # (rule, resources, threads) of every job a dry run lists
from tests.conftest import REPO, REPO_IGNORE, torch_train_args

pytestmark = pytest.mark.slurm

STATE = Path(os.environ.get("LLMPIPE_SLURM_DIR", "/tmp/llmpipe-slurm"))
SKIP = REPO_IGNORE
FINAL = "results/default/checkpoints/torch/final"  # the training rule's output, as a target


def snakemake(cwd, *args, profile="slurm-local", timeout=600, env=None):
    cmd = ["timeout", "-k", "10", str(timeout), sys.executable, "-m", "snakemake", "--profile", f"profiles/{profile}", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})})


def cluster_up() -> bool:
    try:
        return "UP" in subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def slurm():
    """The local cluster, installed and started if needed; stopped at the end if this session started it.
    Under CI (CI set) a cluster that cannot start fails the tests instead of skipping them."""

    def unavailable(msg):
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"local Slurm cluster unavailable: {msg}")

    if os.geteuid() != 0:
        unavailable("scripts/slurm-local-start.sh needs root")
    was_up = cluster_up()
    proc = subprocess.run([str(REPO / "scripts" / "slurm-local-start.sh")], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        unavailable(proc.stderr[-3000:])
    yield STATE
    if not was_up:
        subprocess.run([str(REPO / "scripts" / "slurm-local-stop.sh")], capture_output=True, timeout=120)


def run_id(output: str) -> str:
    """The SLURM run ID Snakemake printed: the name of every Slurm job of that run."""
    ids = re.findall(r"SLURM run ID: (\S+)", output)
    assert len(ids) == 1, output[-3000:]
    return ids[0]


def jobcomp(name: str) -> list[dict]:
    """Finished jobs of one Snakemake run (job name = its SLURM run ID) from the cluster's job log."""
    jobs = []
    for line in (STATE / "jobcomp.log").read_text().splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if fields.get("Name") == name:
            jobs.append(fields)
    return sorted(jobs, key=lambda j: int(j["JobId"]))


def slurm_logs(workdir: Path) -> dict[str, tuple[str, str]]:
    """Slurm job id -> (rule, wildcards) from .snakemake/slurm_logs/rule_<rule>/[<wildcards>/]<jobid>.log."""
    root = workdir / ".snakemake" / "slurm_logs"
    out = {}
    for log in root.rglob("*.log"):
        parts = log.relative_to(root).parts
        out[log.stem] = (parts[0].removeprefix("rule_"), "/".join(parts[1:-1]))
    return out


def overlay(workdir: Path, name: str, data: dict) -> str:
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture(scope="module")
def pipeline(slurm, tmp_path_factory):
    """The embedded default through profiles/slurm-local (every job via sbatch), run once; 20 training
    steps, not 120 (the whole default trains in tests/test_workflow.py; here every rule's job counts)."""
    work = tmp_path_factory.mktemp("slurm") / "repo"
    shutil.copytree(REPO, work, ignore=SKIP)
    short = overlay(work, "short", {"train": {"max_steps": 20, "save_interval": 10, "eval_interval": 10}})
    plan = snakemake(work, "-n", "--configfile", short, timeout=120)
    assert plan.returncode == 0, plan.stderr[-3000:]
    started = time.perf_counter()
    proc = snakemake(work, "--configfile", short, timeout=900)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    run = work / "results" / "default"
    return {
        "work": work,
        "run": run,
        "proc": proc,
        "plan": dry_run_jobs(plan.stdout),
        "seconds": time.perf_counter() - started,
        "metrics": [json.loads(x) for x in (run / "train" / "metrics.jsonl").read_text().splitlines()],
    }


def test_pipeline_runs_one_slurm_job_per_rule_instance(pipeline):
    work, run = pipeline["work"], pipeline["run"]
    print(f"slurm-local pipeline: {pipeline['seconds']:.0f} s")
    assert (run / "eval.json").is_file() and (run / "hf" / "model.safetensors").is_file()
    jobs = jobcomp(run_id(pipeline["proc"].stdout + pipeline["proc"].stderr))
    all_logs = slurm_logs(work)
    assert all(j["JobId"] in all_logs for j in jobs), (jobs, all_logs)
    logs = {j["JobId"]: all_logs[j["JobId"]] for j in jobs}
    assert all(j["JobState"] == "COMPLETED" and j["NodeList"] == "localhost" and j["WorkDir"] == str(work) for j in jobs), jobs
    # exactly the jobs the dry run planned (all of them remote but the local rules `all` and `plan`)
    expected = collections.Counter(rule for rule, _, _ in pipeline["plan"] if rule not in ("all", "plan"))
    assert collections.Counter(rule for rule, _ in logs.values()) == expected
    shards = sorted(wc for rule, wc in logs.values() if rule == "tokenize")
    # one source, 2 shards: one tokenize job reads it once and writes both (data.shards_per_job auto)
    assert shards == ["00000"], shards
    text = (work / "results/default/logs/tokenize/job-00000.log").read_text()
    assert sorted(int(s) for s in re.findall(r"shard (\d+) written by pid", text)) == [0, 1], text[-2000:]
    # the profile's resources reached sbatch: train_torch mem 4000 MB / 60 min, 2 CPUs (= threads)
    train = [j for j in jobs if logs[j["JobId"]][0] == "train_torch"]
    assert len(train) == 1 and train[0]["TimeLimit"] == "60", train
    assert train[0]["Tres"].startswith("cpu=2,mem=4000M,node=1"), train
    # the plan (a local rule, on this host) was given that runtime and the profile's attempts (retries + 1)
    retries = yaml.safe_load((work / "profiles" / "slurm-local" / "config.v8+.yaml").read_text())["retries"]
    limit = json.loads((run / "plan.json").read_text())["time_limit"]
    assert limit == {"rule": "train_torch", "minutes": float(train[0]["TimeLimit"]), "attempts": retries + 1}, limit


def test_failing_job_is_retried(slurm, pipeline, tmp_path):
    marker = tmp_path / "failed-once"
    proc = snakemake(
        pipeline["work"],
        "results/retry/data/sources.json",
        "--config",
        "run=retry",
        timeout=300,
        env={"LLMPIPE_FAIL_ONCE": f"get-data:{marker}"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert marker.exists() and "Trying to restart job" in proc.stdout + proc.stderr
    jobs = jobcomp(run_id(proc.stdout + proc.stderr))
    assert [(j["JobState"], j["ExitCode"]) for j in jobs] == [("FAILED", "1:0"), ("COMPLETED", "0:0")], jobs
    first = slurm_logs(pipeline["work"])[jobs[0]["JobId"]]
    assert first == ("get_data", "")
    assert json.loads((pipeline["work"] / "results" / "retry" / "data" / "sources.json").read_text())


@pytest.mark.parametrize(
    "resources, message",
    [
        ({"cpus_per_task": 64}, "More processors requested than permitted"),
        ({"mem_mb": 100_000_000}, "Memory specification can not be satisfied"),
        ({"gres": "gpu:8"}, "Requested node configuration is not available"),  # the node has 2 (fake) GPUs
    ],
)
def test_impossible_request_fails_at_submit(slurm, pipeline, resources, message):
    cfg = overlay(pipeline["work"], "impossible", {"run": "impossible", "resources": {"default": resources}})
    target = "results/impossible/data/sources.json"
    # llmpipe doctor (onstart) names the request against the largest node before anything is submitted
    proc = snakemake(pipeline["work"], target, "--configfile", cfg, timeout=120)
    out = proc.stdout + proc.stderr
    key = next(iter(resources)).replace("gres", "gpus").replace("cpus_per_task", "cpus")
    assert proc.returncode not in (0, 124, 137) and "problem(s) before any job" in out, out[-3000:]
    assert re.search(rf"Slurm: default asks for \d+ {key} a node, the largest node of .* has", out), out[-3000:]
    assert "SLURM sbatch failed" not in out
    # without the checks (--no-hooks), sbatch itself refuses at once, not left pending
    started = time.perf_counter()
    proc = snakemake(pipeline["work"], target, "--configfile", cfg, "--no-hooks", timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode not in (0, 124, 137), out[-3000:]
    assert "SLURM sbatch failed" in out and message in out, out[-3000:]
    assert time.perf_counter() - started < 90


def test_one_node_two_processes_through_srun_and_torchrun(slurm, pipeline):
    """The multi-node launch path on the one node: srun, one task per node, torchrun with the job's
    head node and port; 2 gloo processes give the 1-process losses (warmup steps share their LR)."""
    work, run = pipeline["work"], pipeline["run"]
    shutil.rmtree(run / "checkpoints" / "torch", ignore_errors=True)
    cfg = overlay(
        work,
        "srun",
        {
            "train": {"threads": 1, "launcher": "srun", "max_steps": 12},
            "parallel": {"nproc_per_node": 2},
            "resources": {"train": {"mem_mb": 3000, "runtime": 20}},
        },
    )
    proc = snakemake(work, FINAL, "--configfile", cfg, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (job,) = jobcomp(run_id(proc.stdout + proc.stderr))
    assert job["JobState"] == "COMPLETED" and job["TimeLimit"] == "20" and job["Tres"].startswith("cpu=2,mem=3000M")
    log = (run / "logs" / "train_torch.log").read_text()
    port = 29500 + int(job["JobId"]) % 1000
    assert "srun --overlap --kill-on-bad-exit=1 --nodes=1 --ntasks=1 --ntasks-per-node=1 --cpus-per-task=2 " in log, log[:3000]
    assert (
        f"-m torch.distributed.run --nnodes 1 --node_rank 0 --nproc_per_node 2 --master_addr localhost "
        f"--master_port {port} -m llmpipe torch-train" in log
    ), log[:3000]
    assert "world 2 (DDP)," in log
    summary = json.loads((run / "checkpoints" / "torch" / "final" / "train_summary.json").read_text())
    assert summary["world_size"] == 2
    two = [json.loads(x) for x in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in two] == list(range(1, 13))
    for r2, r1 in zip(two[:10], pipeline["metrics"][:10]):
        assert r2["loss"] == pytest.approx(r1["loss"], abs=1e-4), r1["step"]


def test_scancel_mid_training_is_retried_and_resumes_bit_exactly(slurm, pipeline, tmp_path):
    """scancel of the running training job: Snakemake resubmits it (retries), it resumes from its newest
    complete checkpoint, and the final weights equal an uninterrupted run's (the CLI, no Slurm), bit for bit."""
    work, run = pipeline["work"], pipeline["run"]
    ckpts = run / "checkpoints" / "torch"
    shutil.rmtree(ckpts, ignore_errors=True)
    train = {"max_steps": 40, "save_interval": 5}
    cfg = overlay(work, "cancel", {"train": train})
    cmd = [
        "timeout",
        "-k",
        "10",
        "600",
        sys.executable,
        "-m",
        "snakemake",
        "--profile",
        "profiles/slurm-local",
        FINAL,
        "--configfile",
        cfg,
    ]
    with subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as sm:
        try:
            deadline = time.time() + 300
            while not list(ckpts.glob("step_*/done")):
                assert sm.poll() is None and time.time() < deadline, "no checkpoint before the training ended"
                time.sleep(0.1)
            running = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i|%k|%Z"], capture_output=True, text=True).stdout
            (job_id,) = [
                line.split("|")[0] for line in running.splitlines() if line.split("|")[1:] == ["rule_train_torch", str(work)]
            ]
            subprocess.run(["scancel", job_id], check=True)
            out, _ = sm.communicate(timeout=660)
        except BaseException:
            sm.terminate()  # timeout passes SIGTERM on; Snakemake then cancels its Slurm jobs
            raise
    assert sm.returncode == 0, out[-5000:]
    jobs = jobcomp(run_id(out))
    assert [(j["JobId"] == job_id, j["JobState"]) for j in jobs] == [(True, "CANCELLED"), (False, "COMPLETED")]
    resumed = re.findall(r"resumed from \S+step_(\d+) \(step (\d+)\)", (run / "logs" / "train_torch.log").read_text())
    assert len(resumed) == 1 and 5 <= int(resumed[0][1]) < 40, resumed

    # the same training, uninterrupted, straight from the CLI
    base = yaml.safe_load((work / "config" / "config.yaml").read_text())
    config = {**base, "train": {**base["train"], **train}}
    ref = tmp_path / "ref"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "llmpipe",
            *torch_train_args(
                config,
                run / "checkpoints" / "init",
                run / "data" / "views" / "hf",
                ref / "ckpt",
                ref / "metrics.jsonl",
                ref / "final",
            ),
        ],
        cwd=work,
        check=True,
        capture_output=True,
        timeout=600,
    )
    expected = load_file(str(ref / "final" / "model.safetensors"))
    weights = load_file(str(ckpts / "final" / "model.safetensors"))
    assert weights.keys() == expected.keys()
    for key, value in expected.items():
        assert weights[key].equal(value), key
    losses = lambda path: [json.loads(x)["loss"] for x in path.read_text().splitlines()]
    assert losses(run / "train" / "metrics.jsonl") == losses(ref / "metrics.jsonl")


def test_more_nodes_than_the_cluster_has_fails_at_submit(slurm, pipeline):
    # 2 CPUs: only nodes are short. resume false: the pipeline's checkpoints were trained with other
    # settings (max_steps), which would stop the run at parse time, before any submit.
    cfg = overlay(pipeline["work"], "nodes", {"train": {"threads": 1, "resume": False}, "parallel": {"nnodes": 2}})
    proc = snakemake(pipeline["work"], FINAL, "--configfile", cfg, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode not in (0, 124, 137) and "Node count specification invalid" in out, out[-3000:]
    assert "--nodes=2" in out and "--ntasks=2" in out  # one launcher task per node


# --- the cluster profiles, dry run (no cluster needed) ---


def profile_rules(profile: str) -> set[str]:
    spec = yaml.safe_load((REPO / "profiles" / profile / "config.v8+.yaml").read_text())
    return set(spec.get("set-resources", {})) | set(spec.get("set-threads", {}))


@pytest.mark.parametrize("profile", ["slurm-local", "slurm-trn1", "gpu-colossal"])
def test_profiles_only_size_rules_that_exist(profile):
    """Snakemake ignores set-resources for unknown rules: a renamed rule must not silently lose its resources."""
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--list-rules"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    rules = set(proc.stdout.split())  # the default backend's workflow, plus every backend's own rules:
    rules |= {m for f in (REPO / "rules").glob("train_*.smk") for m in re.findall(r"^rule (\w+):", f.read_text(), re.M)}
    assert profile_rules(profile) - rules == set()


def test_trn1_profile_resources_per_rule_and_config_overrides(tmp_path):
    proc = snakemake(REPO, "-n", "--cores", "1024", "--config", f"results_dir={tmp_path}", profile="slurm-trn1", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = dry_run_jobs(proc.stdout)
    assert "train_torch" not in {rule for rule, _, _ in jobs}  # the profile trains neuron by itself
    nodes = yaml.safe_load((REPO / "config/presets/llama-2-7b-trn1.yaml").read_text())["parallel"]["nnodes"]
    for name in ("train_neuron", "neuron_precompile"):
        (train,) = [r for rule, r, _ in jobs if rule == name]
        assert {k: train[k] for k in ("nodes", "tasks", "cpus_per_task", "mem_mb", "slurm_extra")} == {
            "nodes": str(nodes),
            "tasks": str(nodes),
            "cpus_per_task": "128",
            "mem_mb": "480000",
            "slurm_extra": "--exclusive",
        }
    tokenize = [(r, t) for rule, r, t in jobs if rule == "tokenize"]
    prof = yaml.safe_load((REPO / "profiles/slurm-trn1/config.v8+.yaml").read_text())
    want = (prof["set-threads"]["tokenize"], str(prof["set-resources"]["tokenize"]["mem_mb"]), "240")
    # the preset's sources are fewer than its shards: one tokenize job (data.shards_per_job auto)
    assert len(tokenize) == 1 and all((t, r["mem_mb"], r["runtime"]) == want for r, t in tokenize), tokenize

    over = tmp_path / "o.yaml"
    over.write_text(
        yaml.safe_dump(
            {
                "train": {"global_batch_size": 32},
                "parallel": {"nnodes": 8},
                "resources": {"default": {"slurm_partition": "trn1"}, "train": {"runtime": 600}, "tokenize": {"mem_mb": 4000}},
            }
        )
    )
    proc = snakemake(
        REPO,
        "-n",
        "-p",
        "--cores",
        "1024",
        "--config",
        f"results_dir={tmp_path}",
        "--configfile",
        str(over),
        profile="slurm-trn1",
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = dry_run_jobs(proc.stdout)
    (train,) = [r for rule, r, _ in jobs if rule == "train_neuron"]
    assert (train["nodes"], train["tasks"], train["runtime"], train["cpus_per_task"], train["slurm_partition"]) == (
        "8",
        "8",
        "600",
        "128",
        "trn1",
    )
    assert all(r["mem_mb"] == "4000" and r["slurm_partition"] == "trn1" for rule, r, _ in jobs if rule == "tokenize")
    assert '"nnodes": 8' in proc.stdout[proc.stdout.index("rule train_neuron:") :]


def test_gpu_colossal_profile_requests_gpus_per_node(tmp_path):
    proc = snakemake(REPO, "-n", "--cores", "1024", "--config", f"results_dir={tmp_path}", profile="gpu-colossal", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = {rule: r for rule, r, _ in dry_run_jobs(proc.stdout)}
    assert "train_torch" not in jobs
    train = jobs["train_colossal"]
    assert {k: train[k] for k in ("gres", "tasks_per_gpu", "cpus_per_task", "mem_mb", "slurm_extra")} == {
        "gres": "gpu:8",
        "tasks_per_gpu": "0",
        "cpus_per_task": "96",
        "mem_mb": "1000000",
        "slurm_extra": "--exclusive",
    }
    assert jobs["evaluate"]["gres"] == "gpu:1" and "gres" not in jobs["tokenize"]


def test_unknown_rule_in_resources_is_named(tmp_path):
    over = tmp_path / "o.yaml"
    over.write_text("resources: {tokenise: {mem_mb: 10}}\n")
    proc = snakemake(
        REPO, "-n", "--configfile", str(over), "--config", f"results_dir={tmp_path}", profile="slurm-trn1", timeout=120
    )
    assert proc.returncode != 0
    assert "unknown rule(s) under 'resources': tokenise" in proc.stdout + proc.stderr


def test_tokenize_shards_are_batched_into_few_sbatch_jobs(slurm, tmp_path):
    """8 shards, 4 a job: 2 sbatch submissions for tokenize, each running its shards in 2 worker processes
    started at once (both before either wrote its last shard: with this little data a worker's encoding,
    ~0.1 s, can end before the other's interpreter is up, seen in CI), and the store equals the one
    written one shard a job (run locally)."""
    work = tmp_path / "repo"
    shutil.copytree(REPO, work, ignore=SKIP)
    store = "data/tokens/manifest.json"
    grouped = overlay(work, "grouped", {"data": {"num_shards": 8, "shards_per_job": 4}})
    proc = snakemake(work, f"results/default/{store}", "--configfile", grouped, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs, logs = jobcomp(run_id(proc.stdout + proc.stderr)), slurm_logs(work)
    tokenize = [j for j in jobs if logs[j["JobId"]][0] == "tokenize"]
    assert len(tokenize) == 2 and all(j["Tres"].startswith("cpu=2,") for j in tokenize), tokenize
    for job in range(2):
        text = (work / f"results/default/logs/tokenize/job-{job:05d}.log").read_text()
        done = [
            (int(s), int(p), float(a), float(b))
            for s, p, a, b in re.findall(r"shard (\d+) written by pid (\d+) from (\S+) to (\S+)", text)
        ]
        assert sorted(s for s, *_ in done) == list(range(4 * job, 4 * job + 4)), text[-2000:]
        started = {int(p): float(t) for p, t in re.findall(r"worker pid (\d+) started at (\S+)", text)}
        spans = {p: (started[p], max(b for _, q, _, b in done if q == p)) for _, p, _, _ in done}
        assert len(spans) == 2, spans  # two worker processes ...
        (a0, b0), (a1, b1) = spans.values()
        assert max(a0, a1) < min(b0, b1), spans  # ... both started before either was done

    single = overlay(work, "single", {"results_dir": "ref", "data": {"num_shards": 8, "shards_per_job": 1}})
    proc = snakemake(work, f"ref/default/{store}", "--configfile", single, profile="local", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("rule tokenize:") + proc.stderr.count("rule tokenize:") == 8
    ours, ref = (json.loads((work / r / "default" / store).read_text()) for r in ("results", "ref"))
    assert [e["file"] for e in ours["shards"]] == [f"job-{i // 4:05d}/shard-{i:05d}.safetensors" for i in range(8)]
    assert [e["file"] for e in ref["shards"]] == [f"job-{i:05d}/shard-{i:05d}.safetensors" for i in range(8)]
    assert ours["fingerprint"] == ref["fingerprint"] and ours["totals"] == ref["totals"]
    for a, b in zip(ours["shards"], ref["shards"]):
        ta = (work / "results/default/data/tokens" / a["file"]).read_bytes()
        assert ta == (work / "ref/default/data/tokens" / b["file"]).read_bytes(), a["file"]


# --- the gpu-colossal profile on the sandbox, and llmpipe doctor against it ---

COLOSSAL_PY = REPO / ".venvs" / "colossal" / "bin" / "python"


def need_colossal_env():
    """The profile's own interpreter (colossal.python: .venvs/colossal/bin/python); CI must have built it."""
    if COLOSSAL_PY.exists():
        return
    msg = f"{COLOSSAL_PY} is missing: build it with scripts/setup-env-colossal.sh --cpu"
    (pytest.fail if os.environ.get("CI") else pytest.skip)(msg)


def test_gpu_colossal_trains_through_sbatch_in_the_profiles_environment(slurm, tmp_path):
    """`snakemake --profile profiles/gpu-colossal` with a config that only fits its preset (Llama-2-7B,
    Gemini, 8 GPUs) to the sandbox and a CPU: the embedded default's model and data, one process, the ddp
    plugin, fp32 (auto on CPU) and resources the node has. colossal.python is left to the profile: the
    training job runs .venvs/colossal/bin/python (relative to the working directory, as on a cluster)."""
    need_colossal_env()
    work = tmp_path / "repo"
    shutil.copytree(REPO, work, ignore=SKIP)
    (work / ".venvs").symlink_to(REPO / ".venvs")  # the environment scripts/setup-env-colossal.sh built
    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg = overlay(
        work,
        "sandbox",
        {
            "tokenizer": {"vocab_size": base["tokenizer"]["vocab_size"]},
            "model": {k: v for k, v in base["model"].items() if k != "init_from"},
            "train": {
                "seq_len": base["train"]["seq_len"],
                "global_batch_size": 8,
                "micro_batch_size": 8,
                "precision": "auto",
                "lr": base["train"]["lr"],
                "min_lr": base["train"]["min_lr"],
                "warmup_steps": 3,
                "max_steps": 12,
                "save_interval": 6,
                "eval_interval": 6,
            },
            "parallel": {"nproc_per_node": 1, "activation_checkpointing": False},
            "colossal": {"plugin": "ddp", "flash_attention": False},  # Gemini needs CUDA
            # every rule: the sandbox's partition and sizes; no GPUs (gres none), no --exclusive
            "resources": {
                "default": {
                    "slurm_partition": "local",
                    "mem_mb": 3000,
                    "cpus_per_task": 2,
                    "runtime": 30,
                    "gres": "none",
                    "slurm_extra": "",
                }
            },
        },
    )
    assert "python" not in yaml.safe_load(Path(cfg).read_text())["colossal"]
    run = work / "results" / "llama-2-7b-colossal"  # the preset's run name
    started = time.perf_counter()
    # no slurmdbd in the sandbox: job states from squeue (as profiles/slurm-local); no retries of a failure
    sm = ["--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "1", "--retries", "0"]
    proc = snakemake(work, f"{run.relative_to(work)}/hf", "--configfile", cfg, *sm, profile="gpu-colossal", timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:] + _tail(run / "logs" / "train_colossal.log")
    print(f"gpu-colossal on the sandbox: {time.perf_counter() - started:.0f} s")

    # every job through sbatch; the training job with the config's resources (no gres)
    jobs, logs = jobcomp(run_id(out)), slurm_logs(work)
    assert jobs and all(j["JobState"] == "COMPLETED" and j["WorkDir"] == str(work) for j in jobs), jobs
    rules = collections.Counter(logs[j["JobId"]][0] for j in jobs)
    assert rules["train_colossal"] == 1 and rules["export_hf"] == 1 and "train_torch" not in rules, rules
    (train,) = [j for j in jobs if logs[j["JobId"]][0] == "train_colossal"]
    assert train["Partition"] == "local" and train["TimeLimit"] == "30", train
    assert train["Tres"].startswith("cpu=2,mem=3000M,node=1") and "gpu" not in train["Tres"], train
    assert f"SLURM jobid {train['JobId']} (log: {work}/.snakemake/slurm_logs/rule_train_colossal/" in out

    # the profile's interpreter ran the ColossalAI trainer (colossalai is not in this environment)
    log = (run / "logs" / "train_colossal.log").read_text()
    assert f"llmpipe launch: {work}/.venvs/colossal/bin/python -m llmpipe colossal-train " in log, log[:3000]
    assert "llmpipe.backends.colossal.train INFO plugin ddp (tp 1, pp 1, zero 0), world 1" in log, log[-3000:]
    assert "precision fp32" in log and "trained model -> " in log, log[-3000:]
    summary = json.loads((run / "checkpoints" / "colossal" / "final" / "train_summary.json").read_text())
    assert {k: summary[k] for k in ("plugin", "precision", "world_size", "steps")} == {
        "plugin": "ddp",
        "precision": "fp32",
        "world_size": 1,
        "steps": 12,
    }

    # its metrics: a finite loss each step, falling; validation at the eval steps
    metrics = [json.loads(x) for x in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics] == list(range(1, 13))
    losses = [r["loss"] for r in metrics]
    assert all(math.isfinite(x) for x in losses), losses
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3, losses
    assert [r["step"] for r in metrics if "val_loss" in r] == [6, 12]

    # the export: the trained weights (the colossal final checkpoint's), not the initial ones
    weights = load_file(str(run / "hf" / "model.safetensors"))
    assert weights["model.embed_tokens.weight"].shape == (base["tokenizer"]["vocab_size"], base["model"]["hidden_size"])
    final = {}
    for shard in (run / "checkpoints" / "colossal" / "final").glob("*.safetensors"):
        final.update(load_file(str(shard)))
    init = load_file(str(run / "checkpoints" / "init" / "model.safetensors"))
    assert weights.keys() == final.keys() == init.keys()
    assert all(weights[k].equal(final[k]) for k in weights)
    assert sum(not weights[k].equal(init[k]) for k in weights) == len(weights)


def _tail(path: Path, n: int = 3000) -> str:
    return path.read_text()[-n:] if path.is_file() else ""


def doctor(*args, cwd=REPO):
    cmd = ["timeout", "-k", "10", "300", sys.executable, "-m", "llmpipe", "doctor", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)


def problem_lines(proc) -> list[str]:
    return [ln for ln in proc.stdout.splitlines() if not ln.startswith("doctor: ")]


def test_doctor_against_the_sandbox(slurm, tmp_path):
    """llmpipe doctor asks the real cluster (sinfo): slurm-local is ready here; a partition the cluster
    lacks is the one problem; gpu-colossal's GPU rules are matched against the node's gres (gpu:2)."""
    where = ["--config", f"results_dir={tmp_path}"]
    ready = doctor("--profile", "slurm-local", *where)
    assert ready.returncode == 0, ready.stdout + ready.stderr[-3000:]
    assert problem_lines(ready) == [] and "doctor: profile slurm-local: ready" in ready.stdout

    nosuch = doctor("--profile", "slurm-local", "--quick", *where, "resources={default: {slurm_partition: nosuch}}")
    assert nosuch.returncode == 1, nosuch.stdout + nosuch.stderr[-3000:]
    assert problem_lines(nosuch) == [
        # tokenize: named by the profile's set-threads, its CPUs checked against them (on the default partition)
        "Slurm: partition 'nosuch' (default, tokenize, train_torch) does not exist; sinfo lists ['local'] (fix: resources)"
    ], nosuch.stdout
    assert "doctor: profile slurm-local: 1 problem(s)" in nosuch.stdout

    # gpu-colossal sizes whole 8-GPU nodes: each request above the sandbox's node is named, per rule
    colossal = doctor("--profile", "gpu-colossal", "--quick", *where)
    lines = problem_lines(colossal)
    assert colossal.returncode == 1, colossal.stdout + colossal.stderr[-3000:]
    gpus = sum(
        int(n)
        for n in re.findall(r"gpu:(\d+)", subprocess.run(["sinfo", "-h", "-o", "%G"], capture_output=True, text=True).stdout)
    )
    assert f"Slurm: train_colossal asks for 8 gpus a node, the largest node of any partition has {gpus} (fix: resources)" in lines
    assert any(ln.startswith("Slurm: train_colossal asks for 96 cpus a node") for ln in lines)
    # with the config's resources: section fitting the node (as the training test below uses), none is left
    fits = "resources={default: {slurm_partition: local, mem_mb: 3000, cpus_per_task: 2, gres: none}}"
    fitted = doctor("--profile", "gpu-colossal", "--quick", *where, fits)
    assert not [ln for ln in problem_lines(fitted) if ln.startswith("Slurm")], fitted.stdout
    assert not [ln for ln in lines if ln.startswith("colossal environment")] or not COLOSSAL_PY.exists(), lines
