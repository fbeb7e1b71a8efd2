"""Runs of different profiles or presets never share a results folder by accident: the run name follows the
preset or profile unless the config names it, the first run that starts a job records the folder's
identity (model, tokenizer, backend), and a later config with another identity under that name stops
before any job, naming the run, what differs and the way out. Real `snakemake` in a copy of the checkout
(bare profile names, offline: dead proxies)."""

import json
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from llmpipe import config as cfgmod
from llmpipe import profiles, run_identity
from tests.conftest import REPO, REPO_IGNORE
from tests.test_dry_run import OFFLINE_ENV


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    work = tmp_path_factory.mktemp("runs") / "repo"
    shutil.copytree(REPO, work, ignore=REPO_IGNORE, symlinks=True)
    return work


def snakemake(work, *args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "snakemake", *args],  # offline: dead proxies, HF offline
        cwd=work,
        capture_output=True,
        text=True,
        env=OFFLINE_ENV,
        timeout=timeout,
    )


def planned_runs(stdout: str, results_dir: str = "results") -> set[str]:
    """Every results/<run>/ folder a `snakemake -n` listing names (inputs, outputs, logs)."""
    return set(re.findall(rf"(?<![\w/.-]){results_dir}/([^/\s'\",]+)/", stdout))


def profile_config(name: str, **user) -> dict:
    folder = REPO / "profiles" / name
    return cfgmod.validate(profiles.layered(user, folder if (folder / profiles.OVERLAY).is_file() else None)[0])


def default_run() -> str:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())["run"]


def preset_of(profile: str) -> str:
    return yaml.safe_load((REPO / "profiles" / profile / profiles.OVERLAY).read_text())["preset"]


# ------------------------------------------------------------------- names follow the profile / preset


def test_the_quick_start_and_a_hardware_profile_plan_different_folders(clone):
    local = snakemake(clone, "-n", "--profile", "local")
    assert local.returncode == 0, local.stdout[-2000:] + local.stderr[-2000:]
    assert planned_runs(local.stdout) == {default_run()}
    trn1 = snakemake(clone, "-n", "--profile", "slurm-trn1")
    assert trn1.returncode == 0, trn1.stdout[-2000:] + trn1.stderr[-2000:]
    assert planned_runs(trn1.stdout) == {preset_of("slurm-trn1")} and preset_of("slurm-trn1") != default_run()
    assert not (clone / "results" / preset_of("slurm-trn1")).exists()  # a dry run records nothing
    other = snakemake(clone, "-n", "--profile", "slurm-trn1", "--config", "preset=llama-3-70b-trn1")
    assert other.returncode == 0, other.stderr[-2000:]
    assert planned_runs(other.stdout) == {"llama-3-70b-trn1"}
    named = snakemake(clone, "-n", "--profile", "slurm-trn1", "--config", "run=mine")
    assert named.returncode == 0 and planned_runs(named.stdout) == {"mine"}


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "profiles").iterdir() if (p / "config.v8+.yaml").is_file()))
def test_every_profile_has_its_own_run_name_unless_it_runs_the_default(name):
    cfg = profile_config(name)
    overlay = REPO / "profiles" / name / profiles.OVERLAY
    if not overlay.is_file():  # local, slurm-local: the embedded default
        assert cfg["run"] == default_run()
    else:
        expected = yaml.safe_load(overlay.read_text()).get("preset") or name
        assert cfg["run"] == expected != default_run()
    assert profile_config(name, run="exp")["run"] == "exp"  # named by the user: kept


# ------------------------------------------------------------------- identity: recorded, compared


@pytest.fixture(scope="module")
def started(clone):
    """A real run of the embedded default, stopped after its first job (get_data)."""
    run = clone / "results" / default_run()
    target = f"results/{default_run()}/data/sources.json"
    proc = snakemake(clone, "--profile", "local", target)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run


def test_the_identity_is_recorded_when_a_run_starts(started):
    recorded = json.loads((started / run_identity.FILE).read_text())
    cfg = profile_config("local")
    assert recorded["run"] == cfg["run"] and recorded["preset"] == cfg["preset"]
    ident = recorded["identity"]
    assert ident["train"] == {"backend": cfg["train"]["backend"]}
    assert ident["model"] == {k: cfg["model"][k] for k in run_identity.MODEL_SHAPE}
    assert ident["tokenizer"]["source"] == cfg["tokenizer"]["source"]
    assert ident["tokenizer"]["vocab_size"] == cfg["tokenizer"]["vocab_size"]
    assert not [p.name for p in started.iterdir() if ".tmp" in p.name]  # no temporary file left


@pytest.mark.parametrize(
    "args, differs",
    [
        (["--profile", "local", "--config", "model={hidden_size: 256}"], "model.hidden_size"),
        (["--profile", "local", "--config", "tokenizer={vocab_size: 2048}"], "tokenizer.vocab_size"),
        (["--profile", "tpu", "--config", "run=default"], "train.backend"),
    ],
    ids=["model", "tokenizer", "backend"],
)
def test_another_identity_under_the_same_name_stops_before_any_job(clone, started, args, differs):
    before = {p: p.stat().st_mtime_ns for p in started.rglob("*")}
    identity_text = (started / run_identity.FILE).read_text()
    proc = snakemake(clone, *args)  # a real run, not -n
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    old = run_identity._flat(json.loads(identity_text)["identity"])[differs]
    new = run_identity._flat(run_identity.identity(profile_config(args[1], **_cli(args))))[differs]
    assert old != new
    assert f"run '{default_run()}'" in text and f"{differs} {old!r} -> {new!r}" in text, text[-3000:]
    assert "--config run=NEW_NAME" in text and f"delete results/{default_run()}/{run_identity.FILE}" in text
    assert not re.search(r"^(?:local)?rule \w+:", proc.stdout, re.M)  # no job
    assert {p: p.stat().st_mtime_ns for p in started.rglob("*")} == before  # nothing touched
    assert (started / run_identity.FILE).read_text() == identity_text
    # llmpipe check-config refuses the same config with the same line
    check = subprocess.run(
        [sys.executable, "-m", "llmpipe", "check-config", *args], cwd=clone, capture_output=True, text=True, timeout=120
    )
    assert check.returncode != 0 and f"{differs} {old!r} -> {new!r}" in check.stderr, check.stderr


def _cli(args: list[str]) -> dict:
    from llmpipe import overrides

    return overrides.from_entries(args[args.index("--config") + 1 :] if "--config" in args else [])


def test_the_same_identity_proceeds_and_another_name_is_free(clone, started):
    again = snakemake(clone, "--profile", "local", f"results/{default_run()}/data/sources.json")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "Nothing to be done" in again.stdout + again.stderr
    # settings outside the identity may change under the name (Snakemake reruns what they feed)
    longer = snakemake(clone, "-n", "--profile", "local", "--config", "train={max_steps: 160}")
    assert longer.returncode == 0, longer.stderr[-2000:]
    wide = snakemake(clone, "-n", "--profile", "local", "--config", "run=wide", "model={hidden_size: 256}")
    assert wide.returncode == 0, wide.stderr[-2000:]
    assert planned_runs(wide.stdout) == {"wide"}


def test_record_never_replaces_another_identity(tmp_path):
    cfg = profile_config("local")
    assert run_identity.record(cfg, tmp_path) is True
    first = (tmp_path / run_identity.FILE).read_text()
    assert run_identity.record(cfg, tmp_path) is False  # the same identity: kept as it is
    wider = profile_config("local", model={"hidden_size": 2 * cfg["model"]["hidden_size"]})
    with pytest.raises(run_identity.IdentityClash, match=r"model\.hidden_size"):
        run_identity.record(wider, tmp_path)  # another process took the name between check and start
    assert (tmp_path / run_identity.FILE).read_text() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == [run_identity.FILE]
    (tmp_path / run_identity.FILE).write_text("{not json")
    assert "unreadable run identity" in run_identity.clash(cfg, tmp_path)
