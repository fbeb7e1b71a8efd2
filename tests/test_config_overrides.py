"""`--config` works for nested keys: each value given on the command line is typed by the schema before
validation (Snakemake reads `train={max_steps: 160}` as the string '160'), only those (a quoted string in
a YAML file stays an error naming its key), and `llmpipe check-config --config` takes the same overrides,
dotted keys too, which Snakemake's own parser refuses."""

import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

from llmpipe import config as cfgmod
from llmpipe import overrides
from tests.conftest import REPO, REPO_IGNORE
from tests.test_dry_run import OFFLINE_ENV
from tests.test_profiles import shell_config

# what Snakemake says of a dotted key (snakemake/cli.py parse_config), before any of this workflow runs
SNAKEMAKE_DOTTED = "Config entry must start with a valid identifier"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    work = tmp_path_factory.mktemp("overrides") / "repo"
    shutil.copytree(REPO, work, ignore=REPO_IGNORE, symlinks=True)
    return work


def snakemake(work, *args):
    return subprocess.run(
        [sys.executable, "-m", "snakemake", *args], cwd=work, capture_output=True, text=True, env=OFFLINE_ENV, timeout=300
    )


def check_config(work, *args):
    return subprocess.run(
        [sys.executable, "-m", "llmpipe", "check-config", *args], cwd=work, capture_output=True, text=True, timeout=120
    )


def printed_config(stdout: str) -> dict:
    return yaml.safe_load(stdout)  # the `# layers` lines are YAML comments


def test_nested_and_top_level_values_take_the_schema_types(work):
    proc = snakemake(
        work,
        "-n",
        "-p",
        "--profile",
        "local",
        "--config",
        "train={max_steps: 160, lr: 1.0e-4, min_lr: 1e-5}",
        "run=2024",  # Snakemake's own parser makes this the integer 2024; the schema says a run name is a string
        "data={max_records_per_source: 50}",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    train = shell_config(proc.stdout, "plan")["train"]
    assert train["max_steps"] == 160 and type(train["max_steps"]) is int
    assert (train["lr"], train["min_lr"]) == (1.0e-4, 1e-5) and type(train["lr"]) is float
    data = shell_config(proc.stdout, "get_data")["data"]
    assert data["max_records_per_source"] == 50 and type(data["max_records_per_source"]) is int
    assert shell_config(proc.stdout, "plan")["run"] == "2024"
    assert "results/2024/plan.json" in proc.stdout


@pytest.mark.parametrize(
    "args, key, value",
    [
        (["--configfile", "quoted.yaml"], "train.max_steps", "'160'"),  # a string in a YAML file: not converted
        (["--config", "train={max_steps: lots}"], "train.max_steps", "'lots'"),  # not an integer's spelling
        (["--config", "train={resume: 1}"], "train.resume", "'1'"),  # a boolean is true / false, not 1
    ],
)
def test_what_cannot_be_converted_stops_naming_the_key(work, args, key, value):
    (work / "quoted.yaml").write_text("train:\n  max_steps: '160'\n")
    proc = snakemake(work, "-n", "--profile", "local", *args)
    assert proc.returncode != 0
    assert f"'{key}': {value} is not of type" in proc.stdout + proc.stderr, proc.stderr[-2000:]
    check = check_config(work, *(["quoted.yaml"] if "quoted.yaml" in args else ["--config", *args[1:]]))
    assert check.returncode != 0 and f"'{key}': {value} is not of type" in check.stderr, check.stderr


def test_dotted_keys(work):
    """Snakemake refuses `train.max_steps=160` before this workflow runs (the docs name its message and the
    working form); check-config takes it and prints the Snakemake form, which plans the same config."""
    refused = snakemake(work, "-n", "--profile", "local", "--config", "train.max_steps=160")
    assert refused.returncode != 0 and SNAKEMAKE_DOTTED in refused.stdout + refused.stderr, refused.stdout[-2000:]
    assert SNAKEMAKE_DOTTED in (REPO / "docs" / "configuration.md").read_text()

    check = check_config(work, "--profile", "local", "--config", "train.max_steps=160", "train.lr=1e-3")
    assert check.returncode == 0, check.stderr
    printed = printed_config(check.stdout)
    assert printed["train"]["max_steps"] == 160 and type(printed["train"]["max_steps"]) is int
    assert printed["train"]["lr"] == 1e-3
    (form,) = [line for line in check.stdout.splitlines() if line.startswith("# as snakemake --config")]
    planned = snakemake(work, "-n", "-p", "--profile", "local", "--config", *shlex.split(form.split(": ", 1)[1]))
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert shell_config(planned.stdout, "plan")["train"] == {
        k: v for k, v in printed["train"].items() if k in shell_config(planned.stdout, "plan")["train"]
    }


def test_check_config_prints_what_the_workflow_plans(work):
    """The same overrides through check-config and snakemake: one config (the plan rule's slice of it)."""
    args = ["--config", "train={max_steps: 3000, lr: 1e-4}", "run=ovr"]  # NxD: a multiple of save_interval 1000
    check = check_config(work, "--profile", "slurm-trn1", *args)
    assert check.returncode == 0, check.stderr
    printed = printed_config(check.stdout)
    assert (printed["train"]["max_steps"], printed["train"]["lr"], printed["run"]) == (3000, 1e-4, "ovr")
    planned = snakemake(work, "-n", "-p", "--profile", "slurm-trn1", *args)
    assert planned.returncode == 0, planned.stderr[-2000:]
    plan = shell_config(planned.stdout, "plan")
    assert plan["train"] == printed["train"] and plan["run"] == printed["run"]


def test_conversion_follows_the_schema_at_each_path():
    cli = overrides.from_entries(
        [
            "train={document_masking: true, precision: auto, max_steps: '160'}",  # enum [auto, true, false]
            "parallel={activation_checkpointing: selective, tp: 2, nproc_per_node: null}",  # enum / integer / null
            "resources={train: {runtime: 60, slurm_partition: 123}}",  # additionalProperties -> $ref
            "data={sources: [a.jsonl, {path: b.jsonl, weight: 2}], hf_config: null, text_field: 'null'}",
            "tokenizer.vocab_size=8192",
            "model.rope_theta=5e5",
            "preset=",  # KEY= is null, as in Snakemake
            "results_dir=true",  # a string where the schema has only strings
        ]
    )
    assert cli["train"] == {"document_masking": True, "precision": "auto", "max_steps": 160}
    assert cli["parallel"] == {"activation_checkpointing": "selective", "tp": 2, "nproc_per_node": None}
    assert cli["resources"] == {"train": {"runtime": 60, "slurm_partition": "123"}}
    assert cli["data"]["sources"] == ["a.jsonl", {"path": "b.jsonl", "weight": 2}]
    assert cli["data"]["hf_config"] is None and cli["data"]["text_field"] == "null"
    assert cli["tokenizer"] == {"vocab_size": 8192} and cli["model"] == {"rope_theta": 5e5}
    assert type(cli["model"]["rope_theta"]) is float
    assert cli["preset"] is None and cli["results_dir"] == "true"
    with pytest.raises(cfgmod.ConfigError, match="expected KEY=VALUE"):
        overrides.parse(["train"])
    with pytest.raises(cfgmod.ConfigError, match="expected KEY=VALUE"):
        overrides.parse(["train..lr=1"])


def test_only_command_line_values_are_converted():
    """Snakemake's merged overwrite config (files, then --config as it parsed it): a file's string stays."""
    merged = {"train": {"max_steps": "160", "seq_len": "512"}, "run": "x"}  # seq_len: from a file, quoted
    user = overrides.user_layer(merged, ["train={max_steps: 160}"])
    assert user == {"train": {"max_steps": 160, "seq_len": "512"}, "run": "x"}
    with pytest.raises(cfgmod.ConfigError, match=r"'train.seq_len': '512' is not of type 'integer'"):
        cfgmod.validate(user)
    # a dotted key Snakemake passed through (its Python API) becomes the nested key
    assert overrides.user_layer({"train.lr": "1e-4"}, ["train.lr=1e-4"]) == {"train": {"lr": 1e-4}}
