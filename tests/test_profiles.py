"""The profiles are the front door: `snakemake --profile NAME` from the project root picks that hardware's
training path by itself, a user's own config keeps it (or a conflicting backend stops the run naming
both), the plan prices the layout training runs, and `llmpipe dag` draws the planning picture."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmpipe import config as cfgmod
from llmpipe import dag, parallelism, profiles
from llmpipe.data.tokenize import num_jobs as tokenize_jobs
from llmpipe.plan import build
from tests.conftest import REPO, REPO_IGNORE
from tests.test_dry_run import NO_NETWORK, OFFLINE_ENV

# profile -> rules its default run must plan (beside the shared data / export / evaluate rules)
EXPECTED = {
    "local": {"train_torch"},
    "slurm-trn1": {"download_model", "neuron_shard", "neuron_precompile", "train_neuron", "neuron_merge"},
    "slurm-trn2": {"download_model", "neuron_shard", "neuron_precompile", "train_neuron", "neuron_merge"},
    "gpu-colossal": {"train_colossal"},
    "tpu": {"levanter_cache", "train_levanter"},
    "sagemaker": {"sagemaker_upload", "train_sagemaker"},
}
TRAIN_LR = 1.0e-3  # a user config that changes only train.lr (above every preset's min_lr)


def rules_in(stdout: str) -> set[str]:
    return set(re.findall(r"^(?:local)?rule (\w+):", stdout, re.M))


def shell_config(stdout: str, rule: str) -> dict:
    """The --config JSON of a rule's shell command in a `snakemake -n -p` listing."""
    block = stdout[stdout.index(f"rule {rule}:") :]
    return json.loads(re.search(r"--config '(\{.*?\})'", block).group(1))


@pytest.fixture(scope="module")
def fresh_clone(tmp_path_factory):
    """The tree as a clone has it: the top-level profile names are symlinks (checked in git's index)."""
    work = tmp_path_factory.mktemp("clone") / "repo"
    shutil.copytree(REPO, work, ignore=REPO_IGNORE, symlinks=True)
    (work / "lr.yaml").write_text(yaml.safe_dump({"train": {"lr": TRAIN_LR}}))
    return work


@pytest.fixture(scope="module")
def bare_dry_runs(fresh_clone):
    """`snakemake -n -p --profile NAME` (bare names, offline), with and without a user --configfile, all at once."""
    procs = {}
    for name in EXPECTED:
        for user in ((), ("--configfile", "lr.yaml")):
            procs[name, bool(user)] = subprocess.Popen(
                [*NO_NETWORK, sys.executable, "-m", "snakemake", "-n", "-p", "--profile", name, *user],
                cwd=fresh_clone,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=OFFLINE_ENV,
            )
    return {key: (p, *p.communicate(timeout=600)) for key, p in procs.items()}


def test_bare_names_are_symlinks_a_clone_keeps():
    staged = subprocess.run(
        ["git", "ls-files", "--stage", *EXPECTED, "slurm-local"], cwd=REPO, capture_output=True, text=True
    ).stdout.splitlines()
    modes = {line.split()[-1]: line.split()[0] for line in staged}
    if not modes:
        pytest.skip("not a git checkout")
    assert modes == {n: "120000" for n in [*EXPECTED, "slurm-local"]}
    for name in EXPECTED:
        assert (REPO / name).resolve() == (REPO / "profiles" / name).resolve()


@pytest.mark.parametrize("user", [False, True], ids=["profile only", "with a user --configfile"])
@pytest.mark.parametrize("name", list(EXPECTED))
def test_bare_profile_plans_its_hardware_path(bare_dry_runs, name, user):
    proc, out, err = bare_dry_runs[name, user]
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    planned = rules_in(out)
    assert EXPECTED[name] <= planned, EXPECTED[name] - planned
    trainers = {r for r in planned if r.startswith("train_")}
    assert trainers == {r for r in EXPECTED[name] if r.startswith("train_")}  # one trainer, and no stray train_torch
    folder = REPO / "profiles" / name
    default = cfgmod.validate(profiles.layered({}, folder if (folder / "llmpipe.yaml").is_file() else None)[0])
    assert shell_config(out, "plan")["train"]["lr"] == (TRAIN_LR if user else default["train"]["lr"])
    assert shell_config(out, "plan")["train"]["backend"] == default["train"]["backend"]


def test_trn1_default_continues_from_the_base_with_its_tokenizer_at_4096(bare_dry_runs):
    _, out, _ = bare_dry_runs["slurm-trn1", False]
    preset = yaml.safe_load((REPO / "config/presets/llama-2-7b-trn1.yaml").read_text())
    base = shell_config(out, "download_model")["model"]["init_from"]
    assert base == preset["model"]["init_from"] and re.fullmatch(r"meta-llama/Llama-2-7b-hf@[0-9a-f]{40}", base)
    tok = out[out.index("rule tokenizer:") :].split("\n\n")[0]
    assert re.search(r"input: \S+/checkpoints/base", tok)  # the base model's own tokenizer, not a BPE trained here
    assert shell_config(out, "pack_view")["train"]["seq_len"] == 4096
    init = shell_config(out, "init_model")["model"]["init_from"]
    assert init.endswith("/checkpoints/base")


def test_the_70b_preset_is_one_flag(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "-p",
            "--profile",
            "slurm-trn1",
            "--config",
            "preset=llama-3-70b-trn1",
            f"results_dir={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert shell_config(proc.stdout, "pack_view")["train"]["seq_len"] == 8192
    neuron = shell_config(proc.stdout, "train_neuron")
    preset = yaml.safe_load((REPO / "config/presets/llama-3-70b-trn1.yaml").read_text())
    assert (
        {k: neuron["parallel"][k] for k in ("tp", "pp")}
        == {k: preset["parallel"][k] for k in ("tp", "pp")}
        == {"tp": 32, "pp": 8}
    )
    assert neuron["model"]["init_from"] == preset["model"]["init_from"]


@pytest.mark.parametrize(
    "profile, user, named",
    [
        ("slurm-trn1", ["--configfile", "torch.yaml"], ("'neuron'", "'torch'", "train.backend")),
        ("tpu", ["--configfile", "torch.yaml"], ("'levanter'", "'torch'", "train.backend")),
        ("slurm-trn1", ["--config", "preset=llama-2-7b-colossal"], ("'neuron'", "'colossal'", "preset")),
        # the other chip's preset on this profile's nodes (trn2's KV order, 64 processes a node)
        ("slurm-trn1", ["--config", "preset=llama-3-70b-trn2"], ("trn1 nodes", "'trn2'", "preset 'llama-3-70b-trn2'")),
        ("slurm-trn2", ["--config", "neuron={hw_backend: trn1}"], ("trn2 nodes", "neuron.hw_backend 'trn1'", "slurm-trn1")),
        ("slurm-trn2", ["--config", "preset=llama-3-70b-trn1"], ("trn2 nodes", "'trn1'", "preset 'llama-3-70b-trn1'")),
    ],
)
def test_a_conflicting_backend_stops_before_any_job_naming_both(tmp_path, profile, user, named):
    work = tmp_path / "repo"
    shutil.copytree(REPO, work, ignore=REPO_IGNORE, symlinks=True)
    (work / "torch.yaml").write_text("train: {backend: torch}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", profile, *user], cwd=work, capture_output=True, text=True, timeout=300
    )  # a real run, not -n
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"profile '{profile}'" in text and all(n in text for n in named), text[-2000:]
    assert not (work / "results").exists()  # nothing ran
    # llmpipe check-config refuses the same layers with the same words
    args = ["--profile", profile] + (["torch.yaml"] if "torch.yaml" in user else [])
    if user[0] == "--config":
        (work / "p.yaml").write_text(user[1].replace("=", ": ", 1) + "\n")
        args.append("p.yaml")
    check = subprocess.run(
        [sys.executable, "-m", "llmpipe", "check-config", *args], cwd=work, capture_output=True, text=True, timeout=120
    )
    assert check.returncode != 0 and all(n in check.stderr for n in named), check.stderr


def test_a_profile_sized_for_another_trainer_is_an_error(tmp_path):
    """Resources for train_neuron in a profile while the config trains torch: refused, naming both."""
    prof = tmp_path / "trn-nobackend"
    prof.mkdir()
    (prof / "config.v8+.yaml").write_text("executor: local\ncores: 1\nset-resources:\n  train_neuron: {mem_mb: 1000}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--profile", str(prof), "--config", f"results_dir={tmp_path}/r"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "gives resources to train_neuron (train.backend neuron)" in text and "train.backend 'torch'" in text
    assert "profile 'trn-nobackend' gives" in text  # named, though it has no llmpipe.yaml


def test_active_profile_resolution(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    trn = (REPO / "profiles" / "slurm-trn1").resolve()
    assert profiles.active_profile(["-n", "--profile", "slurm-trn1"], {}) == trn
    assert profiles.active_profile(["--profile=profiles/slurm-trn1"], {}) == trn
    assert profiles.active_profile(["--profile", "local"], {}) is None  # no llmpipe.yaml: the config decides
    # cluster jobs: no --profile on their command line, the main process's $LLMPIPE_PROFILE
    assert profiles.active_profile(["--target-jobs", "train_neuron:"], {profiles.PROFILE_ENV: str(trn)}) == trn
    with pytest.raises(cfgmod.ConfigError, match="has no llmpipe.yaml"):
        profiles.active_profile([], {profiles.PROFILE_ENV: str(tmp_path)})
    # a bare `snakemake` with $SNAKEMAKE_PROFILE set: that profile's llmpipe.yaml (it was ignored); an API caller: none
    monkeypatch.setenv("SNAKEMAKE_PROFILE", "slurm-trn1")
    assert profiles.active_profile([], {}) == trn and profiles.active_profile(None, {}) is None


def layered_config(profile: str, **user) -> dict:
    return cfgmod.validate(profiles.layered(user, REPO / "profiles" / profile)[0])


@pytest.mark.parametrize(
    "profile, preset", [("slurm-trn1", None), ("slurm-trn1", "llama-3-70b-trn1"), ("slurm-trn2", None), ("gpu-colossal", None)]
)
def test_plan_prices_the_layout_training_runs(profile, preset):
    cfg = layered_config(profile, **({"preset": preset} if preset else {}))
    plan = build(cfg, allow_unknown_data=True)
    lay, t, backend = plan["layout"], cfg["train"], cfg["train"]["backend"]
    p = cfg["parallel"]
    assert lay["from"] == "parallel" and lay["backend"] == backend
    per_node = p["nproc_per_node"]
    assert (lay["tp"], lay["pp"], lay["zero"], lay["activation_checkpointing"]) == (
        p["tp"],
        p["pp"],
        p["zero"],
        p["activation_checkpointing"],
    )
    if backend == "neuron":  # one process per NeuronCore, ZeRO-1, selective checkpointing: NxD's recipes
        assert per_node == {"trn1": 32, "trn2": 64}[cfg["neuron"]["hw_backend"]] and p["zero"] == 1
        assert p["activation_checkpointing"] == "selective"
    else:  # Gemini is ZeRO-3
        assert cfg["colossal"]["plugin"] == "gemini" and (lay["tp"], lay["pp"], lay["zero"]) == (1, 1, 3)
    for row in plan["hardware"]:
        assert row["instances"] == p["nnodes"] and row["devices"] == p["nnodes"] * per_node
        assert row["dp"] == row["devices"] // (lay["tp"] * lay["pp"])
    # more nodes in the training config: the plan follows, no separate knob to forget
    bigger = layered_config(
        profile,
        **({"preset": preset} if preset else {}),
        parallel={"nnodes": 2 * p["nnodes"]},
        train={"global_batch_size": 2 * t["global_batch_size"]},
    )
    assert build(bigger, allow_unknown_data=True)["hardware"][0]["devices"] == 2 * p["nnodes"] * per_node


def test_plan_rule_gets_the_backend_layout(tmp_path):
    """The plan rule's own --config carries the backend section, so the plan job prices the trained layout."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "-p",
            "--profile",
            "slurm-trn1",
            "--config",
            "preset=llama-3-70b-trn1",
            f"results_dir={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = cfgmod.validate(shell_config(proc.stdout, "plan"), whole=False)  # a job's slice
    assert parallelism.trained(cfg)["tp"] == 32 == layered_config("slurm-trn1", preset="llama-3-70b-trn1")["parallel"]["tp"]


@pytest.mark.parametrize("old, new", sorted(parallelism.MOVED.items()))
def test_old_parallelism_keys_name_the_new_one(old, new):
    section, key = old.split(".")
    with pytest.raises(cfgmod.ConfigError, match=f"'{old}' is now '{new}'"):
        cfgmod.validate({section: {key: 2}})


def test_a_what_if_is_another_parallel_section():
    cfg = layered_config("slurm-trn1", parallel={"tp": 16, "nnodes": 8})
    plan = build(cfg, allow_unknown_data=True)
    assert (plan["layout"]["tp"], plan["layout"]["instances"]) == (16, 8)
    assert plan["hardware"][0]["dp"] == 8 * 32 // 16


@pytest.fixture(scope="module")
def trn1_dag(tmp_path_factory):
    out = tmp_path_factory.mktemp("dag")
    result = dag.planning_dag("slurm-trn1", ["--config", f"results_dir={out}/results"], out / "mpl", use_dot=False)
    return out, result


def test_planning_dag_without_graphviz_is_a_picture(trn1_dag):
    out, result = trn1_dag
    assert result["drawn_with"] == "matplotlib"
    png = (out / "mpl" / "planning-dag.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    svg = (out / "mpl" / "planning-dag.svg").read_text()
    for text in ("train_neuron", "neuron_precompile", "NeuronCores/node", "download_model"):
        assert text in svg, text


def test_planning_dag_labels_say_what_each_rule_asks_for(trn1_dag):
    _, result = trn1_dag
    cfg = layered_config("slurm-trn1")
    prof = yaml.safe_load((REPO / "profiles/slurm-trn1/config.v8+.yaml").read_text())
    train = result["labels"]["train_neuron"]
    nodes, res = cfg["parallel"]["nnodes"], prof["set-resources"]["train_neuron"]
    assert train[0] == f"1 job(s) x {nodes} nodes"
    assert train[1] == (
        f"{cfg['parallel']['nproc_per_node']} NeuronCores/node, {res['cpus_per_task']} CPUs, "
        f"{res['mem_mb'] / 1000:g} GB, {res['runtime'] / 60:g} h, exclusive"
    )
    plan = result["plan"]
    assert train[2] == f"plan: {cfg['train']['max_steps']:,} steps x {cfg['train']['global_batch_size'] * 4096:,} tokens"
    assert train[3].startswith(f"trn1.32xlarge x {nodes}: ") and f"${plan['hardware'][0]['cost_usd']:,.0f}" in train[3]
    assert result["labels"]["download_model"] == ["1 job(s) on the submit host"]
    assert result["labels"]["tokenize"][0] == f"{tokenize_jobs(cfg['data'], n_sources=len(cfg['data']['sources']))} job(s)"
    assert ("download_model", "tokenizer") in result["edges"] and ("train_neuron", "neuron_merge") in result["edges"]


def test_planning_dag_with_graphviz(trn1_dag, tmp_path):
    if not shutil.which("dot"):
        pytest.skip("Graphviz's dot is not installed (the matplotlib picture is tested above)")
    _, result = trn1_dag
    drawn = dag.render(result["rules"], result["edges"], result["labels"], tmp_path / "planning-dag")
    assert drawn == "graphviz"
    svg = (tmp_path / "planning-dag.svg").read_text()
    assert "<svg" in svg and "train_neuron" in svg and "NeuronCores/node" in svg
    assert (tmp_path / "planning-dag.png").read_bytes()[:4] == b"\x89PNG"


def test_dag_cli_writes_the_picture(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmpipe",
            "dag",
            "--profile",
            "gpu-colossal",
            "--out",
            str(tmp_path),
            "--",
            "--config",
            f"results_dir={tmp_path}/r",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    md = (tmp_path / "planning-dag.md").read_text()
    assert "train_colossal" in md and "8 GPUs/node" in md and "p5.48xlarge x 1:" in md
    assert Path(tmp_path / "planning-dag.svg").stat().st_size > 1000


def test_cluster_mixture_count_takes_a_data_jobs_cores(tmp_path):
    """A mixture's get_data counts its files in as many processes as a data job has cores on the cluster:
    the profile's threads for tokenize, not this host's cores (a head node's; 1 in a dry run). Shown with
    --cores 1024 (as `llmpipe dag` plans a cluster profile), so Snakemake's cap on threads is out of the way."""
    from tests.test_config_overrides import snakemake  # it imports this module

    files = 40
    for i in range(files):
        part = tmp_path / f"part-{i:02d}.jsonl"
        part.write_text(json.dumps({"text": f"document {i}"}) + "\n")
    conf = tmp_path / "mix.yaml"
    sources = [
        {"path": str(tmp_path / "part-00.jsonl"), "weight": 0.5},
        {"path": str(tmp_path / "part-[0-9][1-9].jsonl"), "weight": 0.5},
        {"path": str(tmp_path / "part-[1-9]0.jsonl"), "weight": 0.5},
    ]
    conf.write_text(yaml.safe_dump({"results_dir": str(tmp_path / "r"), "data": {"sources": sources}}))
    data_cores = yaml.safe_load((REPO / "profiles/slurm-trn1/config.v8+.yaml").read_text())["set-threads"]["tokenize"]
    assert data_cores < files
    # the profile's number; threads set by an expression (known only per job) leave the cores here
    for extra, want in (((), data_cores), (("--set-threads", "tokenize=max(2, 3)"), files)):
        args = ["-n", "-p", "--profile", "slurm-trn1", "--cores", "1024", "--configfile", str(conf), *extra]
        proc = snakemake(REPO, *args)
        assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
        block = proc.stdout.split("rule get_data:", 1)[1].split("\n\n", 1)[0]
        assert f"threads: {want}" in block and f" --threads {want} " in block, extra


def test_an_sbatch_option_the_slurm_plugin_sets_is_refused_at_parse_time(tmp_path):
    """`--qos` (or -p, --mem, ...) in slurm_extra, from a profile or the config: the Slurm plugin refuses it
    only when it submits that job (hours in, for training); the dry run stops naming the resource to use,
    and the `qos` resource reaches the job."""
    prof = tmp_path / "prof"
    prof.mkdir()
    (prof / "config.v8+.yaml").write_text(
        "executor: local\ncores: 1\nset-resources:\n  train_torch: {slurm_extra: \"'-p gpu'\"}\n"
    )

    def dry(*config):
        cmd = [sys.executable, "-m", "snakemake", "-n", "--profile", str(prof), "--config", f"results_dir={tmp_path}/r", *config]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
        return proc.returncode, proc.stdout + proc.stderr

    rc, text = dry()
    assert rc != 0 and "resources of train_torch: slurm_extra '-p gpu' sets the partition" in text
    assert "use resources 'slurm_partition' instead" in text
    # unquoted in the profile: not Python, so Snakemake passes the text itself
    (prof / "config.v8+.yaml").write_text("executor: local\ncores: 1\nset-resources:\n  get_data: {slurm_extra: --qos=high}\n")
    rc, text = dry()
    assert rc != 0 and "resources of get_data: slurm_extra '--qos=high' sets the quality of service" in text, text[-1500:]
    (prof / "config.v8+.yaml").write_text("executor: local\ncores: 1\n")
    rc, text = dry("resources={train: {slurm_extra: '--exclusive --qos=high'}}")
    assert rc != 0 and "sets the quality of service" in text and "use resources 'qos' instead" in text, text[-1500:]
    rc, text = dry("resources={train: {slurm_extra: --exclusive, qos: high}}")
    assert rc == 0, text[-1500:]
    block = text[text.index("rule train_torch:") :]
    assert "qos=high" in block[: block.index("\n\n")]
    assert profiles.slurm_extra_problems({"r": "--exclusive --mail-type=END"}) == []


def test_more_training_processes_than_gres_gpus_is_refused(tmp_path):
    """One process a GPU: nproc_per_node over the training job's gres GPUs a node would fail on a device
    inside the allocation; the dry run stops naming both (as many or fewer: planned)."""

    def dry(nproc):
        over = [f"results_dir={tmp_path}/r", "resources={train: {gres: 'gpu:2'}}", f"parallel={{nproc_per_node: {nproc}}}"]
        cmd = [sys.executable, "-m", "snakemake", "-n", "--profile", "local", "--config", *over, "train={micro_batch_size: 4}"]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
        return proc.returncode, proc.stdout + proc.stderr

    rc, text = dry(4)
    assert rc != 0 and "parallel.nproc_per_node 4 is more processes than train_torch asks GPUs for a node (gres 'gpu:2')" in text
    rc, text = dry(2)
    assert rc == 0, text[-1500:]
    assert profiles.gpu_problem("neuron", 32, "gpu:2") is None  # NeuronCores are not gres GPUs here


@pytest.mark.parametrize("gres", ["gpu:8", "gpu:a100:8", "gpu:nvidia_a100-sxm4-80gb:8"])
def test_gres_gpu_types_with_hyphens_are_accepted_and_counted(gres):
    """Slurm GPU type names often hold hyphens (gres.conf Type=nvidia_a100-sxm4-80gb): the schema takes them
    as the GPU count reads them."""
    assert cfgmod.load({"resources": {"train": {"gres": gres}}})["resources"]["train"]["gres"] == gres
    assert profiles.gres_gpus(gres) == 8
    with pytest.raises(cfgmod.ConfigError, match="resources.train.gres"):
        cfgmod.load({"resources": {"train": {"gres": "gpu:a100 8"}}})


def test_cluster_profiles_group_a_shard_per_tokenize_thread():
    """A profile giving tokenize jobs N threads (set-threads) sets data.min_shards_per_job N in its
    llmpipe.yaml, so jobs whose shards read apart fill their threads (one setting each, kept equal here)."""
    checked = []
    for prof in sorted((REPO / "profiles").iterdir()):
        threads = (yaml.safe_load((prof / "config.v8+.yaml").read_text()).get("set-threads") or {}).get("tokenize")
        if not (prof / "llmpipe.yaml").is_file() or not isinstance(threads, int) or threads < 2:
            continue
        overlay = yaml.safe_load((prof / "llmpipe.yaml").read_text())
        assert overlay.get("data", {}).get("min_shards_per_job") == threads, prof.name
        checked.append(prof.name)
    assert {"slurm-trn1", "slurm-trn2", "gpu-colossal"} <= set(checked), checked
