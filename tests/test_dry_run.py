"""Every profile dry-runs offline, and the DAG renders (mermaid always, SVG where Graphviz is installed)."""

import os
import shlex
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, REPO_IGNORE

SKIP = REPO_IGNORE
PROFILES = sorted(p.name for p in (REPO / "profiles").iterdir() if (p / "config.v8+.yaml").is_file())
# Any HTTP(S) call fails fast through a dead proxy; where network namespaces work, there is no network at all.
OFFLINE_ENV = {
    **os.environ,
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "http_proxy": "http://127.0.0.1:9",
    "https_proxy": "http://127.0.0.1:9",
    "NO_PROXY": "",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
}


def _no_network_prefix() -> list[str]:
    for prefix in (["unshare", "-n"], ["unshare", "-rn"]):
        try:
            if subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0:
                return prefix
        except (FileNotFoundError, subprocess.TimeoutExpired):
            pass
    return []


NO_NETWORK = _no_network_prefix()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    work = tmp_path_factory.mktemp("dry") / "repo"
    shutil.copytree(REPO, work, ignore=SKIP)
    return work


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory):
    """All profiles' dry runs at once, each in its own copy (under a network namespace the Slurm
    plugin's scontrol query at import waits ~10 s for its timeout; in parallel that is paid once)."""
    procs = {}
    for profile in PROFILES:
        work = tmp_path_factory.mktemp(f"dry-{profile}") / "repo"
        shutil.copytree(REPO, work, ignore=SKIP)
        procs[profile] = subprocess.Popen(
            [*NO_NETWORK, sys.executable, "-m", "snakemake", "-n", "-p", "--profile", f"profiles/{profile}"],
            cwd=work,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=OFFLINE_ENV,
        )
    return {profile: (proc, *proc.communicate(timeout=300)) for profile, proc in procs.items()}


def test_profiles_are_discovered():
    assert "local" in PROFILES, PROFILES


@pytest.mark.parametrize("profile", PROFILES)
def test_dry_run_offline(dry_runs, profile):
    proc, out, err = dry_runs[profile]
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    for rule in ("get_data", "tokenize", "pack_view", "plan", "export_hf", "evaluate", "report_items"):
        assert f"rule {rule}:" in out, (profile, rule)
    assert "This was a dry-run" in out + err


@pytest.mark.parametrize("profile", PROFILES)
def test_every_job_accepts_its_config_slice(dry_runs, profile):
    """Each job's --config (the keys its rule passes, the rest defaults) passes the checks its command runs:
    a rule that left out a section a check reads failed at that job (rule plan on slurm-trn1 / trn2 and
    sagemaker: the default model against their tp / pp, no litgpt view)."""
    from llmpipe import config as cfgmod
    from llmpipe.plan.cli import load_configs

    proc, out, err = dry_runs[profile]
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    checked = []
    for line in out.splitlines():
        argv = shlex.split(line.removeprefix("Shell command:")) if line.startswith("Shell command:") else []
        if "llmpipe" not in argv or "--config" not in argv:
            continue
        command, slice_ = argv[argv.index("llmpipe") + 1], argv[argv.index("--config") + 1]
        if not slice_.startswith("{"):  # a file a job before writes (launch)
            continue
        try:
            load_configs([slice_]) if command == "plan" else cfgmod.load(slice_)
        except cfgmod.ConfigError as exc:
            pytest.fail(f"{profile}: llmpipe {command} refuses the config its rule gives it: {exc}")
        checked.append(command)
    assert {"plan", "tokenize", "pack", "export", "evaluate"} <= set(checked), checked


def test_dag_script_writes_mermaid_and_svg(checkout, tmp_path):
    proc = subprocess.run(["bash", "scripts/dag.sh", str(tmp_path)], cwd=checkout, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rulegraph = (tmp_path / "rulegraph.mmd").read_text()
    assert "flowchart" in rulegraph
    for rule in ("get_data", "tokenize", "train_torch", "plan", "report_items"):
        assert f"[{rule}]" in rulegraph, rule
    dag = (tmp_path / "dag.mmd").read_text()
    assert dag.count("[tokenize - job:") == 1  # one node per tokenize job (1 source, 2 shards: one job reads it once)
    if not shutil.which("dot"):
        pytest.skip("Graphviz's dot is not installed: mermaid only (apt-get install graphviz for SVG)")
    svg = (tmp_path / "dag.svg").read_text()
    assert "<svg" in svg and "plan" in svg and "train_torch" in svg


def plan_time_limit(out: str) -> dict | None:
    """The --time-limit / --attempts / --train-rule the plan job's command carries, None without them."""
    (line,) = [line for line in out.splitlines() if line.startswith("Shell command:") and " llmpipe plan " in line]
    argv = shlex.split(line.removeprefix("Shell command:"))
    if "--time-limit" not in argv:
        return None
    return {k: argv[argv.index(f"--{k}") + 1] for k in ("time-limit", "attempts", "train-rule")}


@pytest.mark.parametrize("profile", PROFILES)
def test_plan_gets_the_training_rules_slurm_runtime_and_attempts(dry_runs, profile):
    """Under Slurm (which ends a job at its runtime) the plan job is given the training rule's runtime and
    attempts as the profile sets them (set-resources, else default-resources; retries + 1), to warn of a
    run longer than that; under other executors, nothing."""
    import yaml

    from llmpipe.profiles import runtime_minutes

    proc, out, err = dry_runs[profile]
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    spec = yaml.safe_load((REPO / "profiles" / profile / "config.v8+.yaml").read_text())
    got = plan_time_limit(out)
    if spec.get("executor") != "slurm":
        assert got is None, got
        return
    rule = got["train-rule"]
    assert rule.startswith("train_") and f"rule {rule}:" in out
    runtime = (spec.get("set-resources", {}).get(rule) or {}).get("runtime", spec.get("default-resources", {}).get("runtime"))
    assert float(got["time-limit"]) == runtime_minutes(runtime)
    assert int(got["attempts"]) == spec.get("retries", 0) + 1


def dry_run(cwd, profile: str, *args: str) -> subprocess.CompletedProcess:
    """`snakemake -n -p --profile profiles/<profile> ARGS` in `cwd`, offline; asserted to succeed."""
    cmd = [*NO_NETWORK, sys.executable, "-m", "snakemake", "-n", "-p", "--profile", f"profiles/{profile}", *args]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=OFFLINE_ENV, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_config_runtime_and_command_line_retries_reach_the_plan(checkout):
    """The config's resources (train) and --retries on the command line win over the profile's."""
    proc = dry_run(checkout, "slurm-local", "--retries", "5", "--config", "resources={train: {runtime: 1500}}")
    assert plan_time_limit(proc.stdout) == {"time-limit": "1500", "attempts": "6", "train-rule": "train_torch"}


def test_verify_checks_the_view_the_run_trains_on_whatever_data_views_lists(checkout):
    """data.views [megatron]: the trainer, plan and evaluate still read views/hf, which verify_data left
    unchecked and unhashed in stats.json; now it verifies every view a job reads."""
    proc = dry_run(checkout, "local", "--config", "data={views: [megatron]}")
    (verify,) = [shlex.split(ln.removeprefix("Shell command:")) for ln in proc.stdout.splitlines() if " llmpipe verify " in ln]
    views = verify[verify.index("--views") + 1 : verify.index("--tokenizer")]
    assert [v.rsplit("/", 1)[-1] for v in views] == ["hf", "megatron"]
