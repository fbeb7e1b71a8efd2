"""llmpipe doctor: what each profile's jobs need on this host, one line per problem, secrets never
printed; and a non-dry snakemake stops on the same problems before any job (Snakefile onstart).
The Slurm side against the real sandbox cluster: tests/test_slurm.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmpipe import doctor

REPO = Path(__file__).resolve().parents[1]
KINDS = r"^(main environment|\w+ environment|Slurm|accelerator|credentials|data|disk|memory)( \([^)]*\))?: "
CANARIES = {"AWS_ACCESS_KEY_ID": "AKIACANARY0123456789", "AWS_SECRET_ACCESS_KEY": "canary/secret/0123456789abcdef"}
HF_CANARY = "hf_canaryTOKEN0123456789abcdefghij"


def no_credentials(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "HF_TOKEN"))}
    env.update(
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
        HF_HOME=str(tmp_path / "hf"),
    )
    return env


def run_doctor(*args, env=None, cwd=REPO):
    cmd = [sys.executable, "-m", "llmpipe", "doctor", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def problem_lines(proc) -> list[str]:
    lines = [ln for ln in proc.stdout.splitlines() if not ln.startswith("doctor: ")]
    for line in lines:
        assert re.match(KINDS, line), f"not a problem line: {line!r}"
    assert len(lines) == len(set(lines)), "a problem printed twice"
    return lines


def test_local_profile_is_ready_here(tmp_path):
    proc = run_doctor("--profile", "local", "--config", f"results_dir={tmp_path}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert problem_lines(proc) == []
    assert "doctor: profile local: ready" in proc.stdout


def test_slurm_trn1_names_each_missing_piece(tmp_path):
    proc = run_doctor("--profile", "slurm-trn1", "--config", f"results_dir={tmp_path}", env=no_credentials(tmp_path))
    assert proc.returncode == 1
    lines = problem_lines(proc)
    # the Neuron environment is never on this machine (Neuron's own pip repository)
    assert any(ln.startswith("neuron environment: neuron.python '.venvs/neuron/bin/python' not found") for ln in lines)
    assert any("scripts/setup-env-neuron.sh" in ln for ln in lines)
    # Llama-2 is gated: no token in this environment
    assert any(ln.startswith("credentials: meta-llama/Llama-2-7b-hf") and "HF_TOKEN" in ln for ln in lines)
    if shutil.which("sbatch") is None:
        assert "Slurm: sbatch not found on PATH" in proc.stdout
    assert f"doctor: profile slurm-trn1: {len(lines)} problem(s)" in proc.stdout


def test_gpu_colossal_names_its_environment_or_its_gpus(tmp_path):
    env_dir = tmp_path / "empty"
    proc = run_doctor(
        "--profile", "gpu-colossal", "--config", f"results_dir={tmp_path}", f"colossal={{python: {env_dir}/bin/python}}"
    )
    assert proc.returncode == 1
    lines = problem_lines(proc)
    assert f"colossal environment: colossal.python '{env_dir}/bin/python' not found" in proc.stdout
    assert any("scripts/setup-env-colossal.sh" in ln for ln in lines if ln.startswith("colossal environment"))
    # the profile's own interpreter: this checkout's .venvs/colossal (CPU variant in CI) has the pins
    own = run_doctor("--profile", "gpu-colossal", "--config", f"results_dir={tmp_path}")
    venv = REPO / ".venvs/colossal/bin/python"
    env_lines = [ln for ln in problem_lines(own) if ln.startswith("colossal environment")]
    assert (env_lines == []) == venv.exists(), env_lines


def test_wrong_pin_in_a_backend_environment_is_named(tmp_path):
    """This interpreter has transformers 5.x: as the colossal interpreter it fails the 4.51.3 pin."""
    proc = run_doctor(
        "--profile", "gpu-colossal", "--config", f"results_dir={tmp_path}", f"colossal={{python: {sys.executable}}}"
    )
    import transformers

    want = f"transformers {transformers.__version__} is installed, needs transformers==4.51.3"
    assert any(want in ln for ln in problem_lines(proc)), proc.stdout
    assert "colossalai is not installed (needs colossalai==0.5.0)" in proc.stdout


def test_tpu_names_the_missing_tpu(tmp_path):
    proc = run_doctor("--profile", "tpu", "--config", f"results_dir={tmp_path}")
    assert proc.returncode == 1
    lines = problem_lines(proc)
    assert "accelerator: levanter.jax_platforms is tpu but JAX finds no TPU here (run on the TPU VM)" in lines
    venv = REPO / ".venvs/levanter/bin/python"
    assert any(ln.startswith("levanter environment") for ln in lines) != venv.exists()
    assert all("fix: scripts/setup-env-levanter.sh --tpu or" in ln for ln in lines if ln.startswith("levanter environment"))


def test_credentials_are_checked_never_printed(tmp_path):
    env = {**no_credentials(tmp_path), **CANARIES, "HF_TOKEN": HF_CANARY}
    over = ["--config", f"results_dir={tmp_path}", "hub={release: {enabled: true, repo_id: me/model}}"]
    proc = run_doctor("--profile", "sagemaker", *over, env=env)
    out = proc.stdout + proc.stderr
    for secret in [*CANARIES.values(), HF_CANARY]:
        assert secret not in out
    lines = problem_lines(proc)
    assert not any("AWS credentials" in ln or "Hub token" in ln for ln in lines)  # present: no problem
    placeholder = "credentials: sagemaker.{} is the sagemaker profile's placeholder (fix: yours in your --configfile)"
    assert {placeholder.format(k) for k in ("role_arn", "s3_prefix", "algorithm_name")} <= set(lines)
    role = "sagemaker={role_arn: 'arn:aws:iam::111111111111:role/Mine'}"
    lines = problem_lines(run_doctor("--profile", "sagemaker", *over, role, env=env))
    assert placeholder.format("role_arn") not in lines and placeholder.format("s3_prefix") in lines
    # without them, each is named
    bare = run_doctor("--profile", "sagemaker", *over, env=no_credentials(tmp_path))
    lines = problem_lines(bare)
    assert any(ln.startswith("credentials: no AWS credentials for the SageMaker job") for ln in lines)
    assert any(ln.startswith("credentials: hub.release.enabled needs a Hub token") for ln in lines)


def test_missing_source_and_full_disk_are_named(tmp_path, monkeypatch):
    proc = run_doctor("--profile", "local", "--config", f"results_dir={tmp_path}", "data={sources: [nowhere/*.jsonl]}")
    assert proc.returncode == 1
    assert problem_lines(proc) == ["data: source 'nowhere/*.jsonl' matches no file here (fix: data.sources)"]
    # a folder or a 0-byte file, which get-data stops on (on_bad_record: fail), was "ready"
    given = tmp_path / "given"  # outside results_dir (files there are the run's own)
    (given / "folder").mkdir(parents=True)
    (given / "empty.jsonl").write_bytes(b"")
    for bad, why in ((given / "folder", "is a directory, not a file"), (given / "empty.jsonl", "is empty (0 bytes)")):
        proc = run_doctor("--profile", "local", "--config", f"results_dir={tmp_path}/results", f"data={{sources: [{bad}]}}")
        assert proc.returncode == 1
        assert problem_lines(proc) == [
            f"data: {bad}: data source {why} (on_bad_record: skip would count and skip it) (fix: data.sources)"
        ]
    # disk: the quick bound against a disk with less free space than the run needs
    from llmpipe import config

    cfg = config.load({"results_dir": str(tmp_path)})
    need = doctor.disk_needed(cfg, doctor._text_bytes(cfg) // 2, None)
    assert need > 0
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(need, need - 1, 1))
    (line,) = doctor.disk(cfg, doctor._sizes(cfg, quick=True))
    assert line.startswith("disk: the run needs about") and str(tmp_path) in line


def test_non_dry_run_stops_before_any_job(tmp_path):
    """snakemake --profile sagemaker without AWS credentials: the doctor's lines, and no job ran."""
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "snakemake", "--profile", "sagemaker", "--config", f"results_dir={results}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=no_credentials(tmp_path), timeout=300)
    assert proc.returncode != 0
    assert "llmpipe doctor: " in proc.stderr and "problem(s) before any job" in proc.stderr
    assert "credentials: no AWS credentials for the SageMaker job" in proc.stderr
    assert not results.exists()  # not even get_data ran
    # the dry run is untouched by the checks
    dry = subprocess.run([*cmd, "-n"], capture_output=True, text=True, cwd=REPO, env=no_credentials(tmp_path), timeout=300)
    assert dry.returncode == 0, dry.stderr[-2000:]


@pytest.mark.parametrize("spec", ["torch>=2.7,<=2.13.0", "numpy>=99"])
def test_main_environment_pins(spec, monkeypatch):
    """A requirement this interpreter does not meet is one line naming it and the fix."""
    monkeypatch.setattr(doctor.tomllib, "loads", lambda text: {"project": {"dependencies": [spec]}})
    found = doctor.main_env()
    if spec.startswith("numpy"):
        import numpy

        assert found == [
            f"main environment ({sys.executable}): numpy {numpy.__version__} is installed, needs numpy>=99 "
            "(fix: pip install -c requirements.lock -e .)"
        ]
    else:
        assert found == []


def test_slurm_requests_are_sized_per_node(monkeypatch):
    """`gpu` is the whole job's (sbatch --gpus), spread over the training rule's nodes; a rule without
    cpus_per_task asks for its threads (the Slurm plugin's --cpus-per-task); sinfo without an answer is
    one line, not every rule "too big" for nodes of 0."""
    from llmpipe import config as cfgmod

    monkeypatch.setattr(doctor.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(doctor, "_nodes", lambda: {"p": {"cpus": 16, "mem_mb": 10**6, "gpus": 8}})
    spec = {"executor": "slurm", "set-threads": {"tokenize": 32}}
    cfg = cfgmod.validate({"parallel": {"nnodes": 2}, "resources": {"train": {"gpu": 16}}}, whole=False)
    too_many = "Slurm: tokenize asks for 32 cpus a node, the largest node of any partition has 16 (fix: resources)"
    assert doctor.executor(spec, cfg) == [too_many]
    cfg = cfgmod.validate({"parallel": {"nnodes": 2}, "resources": {"train": {"gpu": 24}}}, whole=False)
    assert "Slurm: train_torch asks for 12 gpus a node, the largest node of any partition has 8 (fix: resources)" in (
        doctor.executor(spec, cfg)
    )
    monkeypatch.setattr(doctor, "_nodes", lambda: {})
    assert doctor.executor(spec, cfg) == [
        "Slurm: sinfo listed no nodes (is slurmctld reachable from here? check SLURM_CONF and munge)"
    ]


@pytest.mark.parametrize("command", ["doctor", "check-config", "dag"])
def test_a_misspelled_profile_is_named_with_this_checkouts_profiles(command):
    """The same line from every command that takes --profile (dag's came from Snakemake, naming only the
    user's and the system's profile folders; check-config's listed none)."""
    proc = subprocess.run(
        [sys.executable, "-m", "llmpipe", command, "--profile", "slurm-trnl"], capture_output=True, text=True, cwd=REPO
    )
    known = ", ".join(sorted(p.name for p in (REPO / "profiles").iterdir() if p.is_dir()))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert f"profile 'slurm-trnl' not found; this checkout's profiles: {known}" in proc.stderr.splitlines()[-1]


def test_disk_estimate_counts_the_hf_views_bytes_per_token(prepared):
    """The hf view takes 11 bytes a token (int32 input_ids and labels, int8 mask, int16 segment_ids), not
    the 4 the doctor assumed: a data-heavy run was "ready" with most of its disk missing."""
    import datasets

    cfg = prepared["cfg"]
    for split in ("train", "val"):
        ds = datasets.load_from_disk(str(prepared["view"] / split))
        arrow = sum(f.stat().st_size for f in (prepared["view"] / split).glob("*.arrow"))
        tokens = len(ds) * cfg["train"]["seq_len"]
        assert (
            tokens * doctor.view_bytes_per_token("hf", cfg)
            <= arrow
            < tokens * doctor.view_bytes_per_token("hf", cfg) * 1.1 + 4096
        )
    assert doctor.view_bytes_per_token("hf", {**cfg, "data": {**cfg["data"], "segment_ids": False}}) == 9
    lean = {**cfg, "data": {**cfg["data"], "views": ["hf"]}}
    assert doctor.disk_needed(lean, 1000, None) == 1000 * (4 + 11)  # the store, then the hf view
    # checkpoints: 12 bytes a parameter each kept (+ final) and the export's 4; Levanter keeps every save_interval
    steps = {"max_steps": 100, "save_interval": 10, "keep_checkpoints": 2}
    torch_run = {**lean, "train": {**cfg["train"], **steps}}
    assert doctor.disk_needed(torch_run, 0, 1000) == 1000 * (12 * 3 + 4)
    levanter_run = {**lean, "train": {**cfg["train"], **steps, "backend": "levanter"}}
    assert doctor.disk_needed(levanter_run, 0, 1000) == 1000 * (12 * 11 + 4)


def test_a_whole_model_step_with_too_little_memory_is_named():
    """evaluate with eval.stream_weights false holds the whole model in float32 (7.4-7.8 bytes a parameter
    measured), and so does init_model for a new model: slurm-trn1's 64 GB for them and the 70B preset (70.6 B
    parameters) would be killed by Slurm. init_model streams a safetensors base (the preset's Hub base, a local
    folder), evaluate streams its weights by default (auto) and export_hf streams: none is named then."""
    from llmpipe import config, profiles

    trn1 = profiles.profile_dir("slurm-trn1")
    spec = profiles.profile_settings(trn1)

    def preset(**user):  # as doctor layers it: defaults < preset < the profile's overlay < the user's
        return config.validate(profiles.layered({"preset": "llama-3-70b-trn1", **user}, trn1)[0], whole=False)

    assert preset()["eval"]["stream_weights"] == "auto" and doctor.memory(preset(), spec, 70_553_706_496) == []
    big = preset(eval={"stream_weights": False})
    assert big["model"]["init_from"].startswith("meta-llama/")
    (line,) = doctor.memory(big, spec, 70_553_706_496)
    assert line.startswith("memory: evaluate 64000 MB") and "70.6 B parameters" in line
    assert "evaluate: {mem_mb: 539306}" in line and "init_model" not in line
    new = preset(model={"init_from": None}, tokenizer={"source": "data/tokenizers/gpt2"}, eval={"stream_weights": False})
    (line,) = doctor.memory(new, spec, 70_553_706_496)
    assert line.startswith("memory: init_model 64000, evaluate 64000 MB") and "init_model: {mem_mb: 539306}" in line
    assert doctor.memory(config.validate({"preset": "llama-2-7b-trn1"}, whole=False), spec, 6_738_415_616) == []
    trn2 = profiles.profile_dir("slurm-trn2")  # its default: the 70B from Meta's weights, streamed by init_model
    trn2_default = config.validate(profiles.layered({}, trn2)[0], whole=False)
    assert doctor.memory(trn2_default, profiles.profile_settings(trn2), 70_553_706_496) == []


def test_init_model_is_named_for_memory_unless_its_local_base_streams(prepared, tmp_path):
    """A local base folder: init_model is a whole-model step unless llmpipe.model.init.streamed would copy it
    (safetensors holding exactly its model's tensors); pickle weights, or a tensor its model lacks, load whole."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from llmpipe import config, profiles
    from tests.conftest import merge

    spec = profiles.profile_settings(profiles.profile_dir("slurm-trn1"))
    odd, pickled = tmp_path / "odd", tmp_path / "pickled"
    shutil.copytree(prepared["init"], odd)
    tensors = load_file(odd / "model.safetensors")
    save_file({**tensors, "model.extra.weight": torch.zeros(3)}, odd / "model.safetensors", metadata={"format": "pt"})
    shutil.copytree(prepared["init"], pickled, ignore=shutil.ignore_patterns("*.safetensors"))
    torch.save(tensors, pickled / "pytorch_model.bin")

    def named(base):
        user = {"model": {"init_from": str(base), "allow_pickle": True}, "eval": {"stream_weights": False}}
        cfg = config.validate(merge(prepared["cfg"], user), whole=False)
        (line,) = doctor.memory(cfg, spec, 70_553_706_496)
        return line.split(" MB")[0]

    assert named(prepared["init"]) == "memory: evaluate 64000"
    assert named(odd) == named(pickled) == "memory: init_model 64000, evaluate 64000"


def test_the_check_before_the_first_job_names_memory_and_checkpoint_disk_too(tmp_path, capsys):
    """doctor --quick (the onstart hook of a non-dry snakemake) counts the parameters from the config (no
    plan, no download): the whole-model steps' memory and the checkpoints' disk are checked before any job,
    as the full doctor checks them."""
    whole = "eval={stream_weights: false}"  # evaluate holding the model whole (auto would stream it)
    over = ["--profile", "slurm-trn1", "--config", "preset=llama-3-70b-trn1", whole, f"results_dir={tmp_path}/r"]
    lines = {}
    for how in ([], ["--quick"]):
        with pytest.raises(SystemExit):
            doctor.main([*how, *over])
        lines[bool(how)] = capsys.readouterr().out.splitlines()
    memory = [line for line in lines[True] if line.startswith("memory:")]
    assert memory == [line for line in lines[False] if line.startswith("memory:")] and "70.6 B parameters" in memory[0]
    (disk,) = [line for line in lines[True] if line.startswith("disk:")]
    assert float(disk.split("about ")[1].split(" GiB")[0]) > 12 * 70.5e9 * 3 / 2**30  # three steps' weights + moments
