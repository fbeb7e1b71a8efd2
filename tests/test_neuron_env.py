"""scripts/setup-env-neuron.sh, dry-run (no Trainium or Neuron pip repository here): it installs from
Neuron's own repository the pins of envs/neuron.txt, checks out the NxD release whose trainers our
commands target, and is what the Trainium profiles' rules run with."""

import re
import subprocess

import yaml

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "setup-env-neuron.sh"


def dry_run(*args):
    return subprocess.run(["bash", str(SCRIPT), "--dry-run", *args], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_dry_run_installs_the_pins_from_neurons_repository():
    proc = dry_run()
    assert proc.returncode == 0, proc.stderr
    lines = [line[2:] for line in proc.stdout.splitlines() if line.startswith("+ ")]
    assert "python3 -m venv .venvs/neuron" in lines
    assert (
        ".venvs/neuron/bin/python -m pip install --extra-index-url https://pip.repos.neuron.amazonaws.com -r envs/neuron.txt"
    ) in lines
    commit = re.search(r"^NXD_COMMIT=([0-9a-f]{40})", SCRIPT.read_text(), re.M).group(1)
    assert f"git -C neuronx-distributed checkout --detach {commit}" in lines
    # the NxD commit the fixtures and notes were read at
    assert commit.startswith("fbac349") and "fbac349" in (REPO / "tests/fixtures/nxd_configs/README.md").read_text()


def test_neuron_env_and_the_side_env_pin_the_same_transformers():
    """The side env that proves our config.json (tests/test_neuron_hf_config.py) has the transformers
    the Neuron env installs."""

    def pin(path):
        return re.search(r"^transformers==(\S+)", (REPO / path).read_text(), re.M).group(1)

    assert pin("envs/neuron.txt") == pin("envs/nxd-hf-cpu.txt") == "4.48.0"


def test_trainium_profiles_run_with_that_environment():
    for profile in ("slurm-trn1", "slurm-trn2"):
        neuron = yaml.safe_load((REPO / "profiles" / profile / "llmpipe.yaml").read_text())["neuron"]
        want = {"python": ".venvs/neuron/bin/python", "nxd_dir": "neuronx-distributed", "hw_backend": profile[-4:]}
        assert neuron == want, profile


def test_refuses_to_install_off_trainium():
    proc = subprocess.run(["bash", str(SCRIPT), "/tmp/never-made"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "not a Trainium node" in proc.stderr
