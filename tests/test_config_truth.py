"""One config truth: `llmpipe check-config` and `snakemake -n` accept and refuse exactly the same configs
(llmpipe.config.validate runs the schema, the shared checks, the Hub's and the backend's), and a backend
declared outside the package plugs in (tests/plugin_backend: a TEST DOUBLE trainer that copies the model)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO, REPO_IGNORE, corpus_docs, write_jsonl

PLUGIN = REPO / "tests" / "plugin_backend"

# (config, a phrase of the one problem both must name)
BAD = [
    ({"train": {"backend": "torhc"}}, "'train.backend': 'torhc' is not one of"),
    ({"hub": {"release": {"enabled": True}}}, "'hub.release.enabled' is true but 'hub.release.repo_id' is not set"),
    (  # a Llama base released as apache-2.0 (the default before): its licence carries over
        {"model": {"init_from": "meta-llama/Llama-2-7b-hf"}, "hub": {"release": {"enabled": True, "repo_id": "me/m"}}},
        "'hub.release.license' is not set but the model continues 'meta-llama/Llama-2-7b-hf'",
    ),
    (
        {
            "train": {"backend": "sagemaker"},
            "sagemaker": {
                "algorithm_name": "arn:aws:sagemaker:us-east-1:123456789012:algorithm/a",
                "s3_prefix": "s3://bucket1/p",
            },
            "data": {"views": ["hf", "litgpt"]},
        },
        "needs: sagemaker.role_arn",
    ),
    (
        {
            "train": {"backend": "colossal", "global_batch_size": 32},
            "parallel": {"nnodes": 2},
            "colossal": {"launcher": "colossalai"},
        },
        "'colossal.launcher' colossalai on 'parallel.nnodes' > 1 needs 'colossal.hostfile'",
    ),
    (
        {"train": {"backend": "colossal"}, "colossal": {"launcher": "colossalai", "hostfile": "/nonexistent/hosts"}},
        "'colossal.hostfile' '/nonexistent/hosts' does not exist",
    ),
    ({"train": {"backend": "neuron"}, "parallel": {"tp": 16}}, "tp 16 must divide num_attention_heads 4"),
    ({"train": {"backend": "torch"}, "parallel": {"tp": 2}}, "'parallel.tp' 2: the torch (DDP) backend trains only with 1"),
    ({"train": {"nproc": 2}}, "'train.nproc' is now 'parallel.nproc_per_node'"),
    ({"colossal": {"zero_stage": 1}}, "'colossal.zero_stage' is now 'parallel.zero'"),
    ({"train": {"global_batch_size": 12, "micro_batch_size": 8}}, "'train.global_batch_size' (12) is not a multiple"),
    ({"train": {"lr": 1e-4, "min_lr": 1e-3}}, "'train.min_lr' (0.001) exceeds 'train.lr' (0.0001)"),
    ({"resources": {"tokenise": {"mem_mb": 1000}}}, "unknown rule(s) under 'resources': tokenise; use default, train"),
]
GOOD = [
    {},
    {
        "train": {"backend": "sagemaker"},
        "sagemaker": {
            "role_arn": "arn:aws:iam::123456789012:role/r",
            "algorithm_name": "arn:aws:sagemaker:us-east-1:123456789012:algorithm/a",
            "s3_prefix": "s3://bucket1/p",
        },
        "data": {"views": ["hf", "litgpt"]},
    },
]


def problems(text: str) -> list[str]:
    return sorted(line.strip() for line in text.splitlines() if line.startswith("  - "))


def check_config(path, env=None):
    return subprocess.run(
        [sys.executable, "-m", "llmpipe", "check-config", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def dry_run(cwd, path, *extra, env=None):
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "1", *extra, "--configfile", str(path)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.mark.parametrize("cfg,needle", BAD, ids=[n[:40] for _, n in BAD])
def test_check_config_and_snakemake_refuse_the_same(tmp_path, cfg, needle):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"results_dir": str(tmp_path / "r"), **cfg}))
    checked, planned = check_config(path), dry_run(REPO, path)
    assert checked.returncode != 0 and planned.returncode != 0, (checked.stdout, planned.stdout[-2000:])
    from_check, from_snakemake = problems(checked.stderr), problems(planned.stdout + planned.stderr)
    assert from_check == from_snakemake and len(from_check) == 1, (from_check, from_snakemake)
    assert needle in from_check[0]


@pytest.mark.parametrize("cfg", GOOD, ids=["defaults", "sagemaker"])
def test_check_config_and_snakemake_accept_the_same(tmp_path, cfg):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"results_dir": str(tmp_path / "r"), **cfg}))
    checked, planned = check_config(path), dry_run(REPO, path)
    assert checked.returncode == 0, checked.stderr
    assert planned.returncode == 0, planned.stdout[-2000:] + planned.stderr[-2000:]
    backend = (cfg.get("train") or {}).get("backend", "torch")
    assert f"rule train_{backend}:" in planned.stdout


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory):
    """The test backend installed as a package would be: an entry point in a dist-info on the path."""
    site = tmp_path_factory.mktemp("site")
    info = site / "llmpipe_echo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: llmpipe-echo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[llmpipe.backends]\necho = llmpipe_echo\n")
    path = os.pathsep.join([str(site), str(PLUGIN), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def test_a_backend_plugs_in_from_outside(tmp_path, plugin_env):
    listed = subprocess.run([sys.executable, "-m", "llmpipe", "backends"], capture_output=True, text=True, env=plugin_env)
    assert "echo: TEST DOUBLE" in listed.stdout and "commands: echo-train" in listed.stdout, listed.stdout + listed.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"train": {"backend": "echo"}, "parallel": {"nnodes": 2}, "echo": {"copies": 2}}))
    checked, planned = check_config(bad, plugin_env), dry_run(REPO, bad, env=plugin_env)
    assert (
        problems(checked.stderr)
        == problems(planned.stdout + planned.stderr)
        == ["- 'echo.copies' 2 needs 'parallel.nnodes' 1 (got 2)"]
    )
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(yaml.safe_dump({"train": {"backend": "echo"}, "echo": {"copies": 0}}))
    assert "'echo.copies': 0 is less than the minimum of 1" in check_config(unknown, plugin_env).stderr
    # Without the plugin installed, the same config names the backends there are.
    assert "'train.backend': 'echo' is not one of" in check_config(unknown).stderr


@pytest.mark.slow
def test_plugged_in_backend_runs_through_export(tmp_path, plugin_env):
    work = tmp_path / "repo"
    shutil.copytree(REPO, work, ignore=REPO_IGNORE)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", corpus_docs(40))
    cfg = tmp_path / "echo.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "run": "echo",
                "results_dir": str(tmp_path / "results"),
                "train": {"backend": "echo", "seq_len": 64},
                "data": {"sources": [str(corpus)], "num_shards": 1},
                "tokenizer": {"vocab_size": 300},
                "model": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1},
            }
        )
    )
    run = tmp_path / "results" / "echo"
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2", str(run / "hf"), "--configfile", str(cfg)],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
        env=plugin_env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"rule train_echo:", proc.stdout + proc.stderr)
    init, final = run / "checkpoints" / "init", run / "checkpoints" / "echo" / "final"
    assert (final / "model.safetensors").read_bytes() == (init / "model.safetensors").read_bytes()
    exported = json.loads((run / "hf" / "config.json").read_text())
    assert exported["hidden_size"] == 32 and exported["num_hidden_layers"] == 1


def test_cli_help_goes_to_stdout_and_a_mistyped_command_is_named():
    """`llmpipe --help | less` shows the commands; a mistyped command is named, with the nearest one."""
    run = [sys.executable, "-m", "llmpipe"]
    helped = subprocess.run([*run, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "\n  doctor\n" in helped.stdout and not helped.stderr
    typo = subprocess.run([*run, "doctr", "--profile", "local"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert typo.returncode == 2 and "llmpipe: unknown command 'doctr' (did you mean 'doctor'?)" in typo.stderr
