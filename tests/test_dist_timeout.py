"""train.dist_timeout_minutes reaches the process group (gloo here; NCCL takes the same argument): the torch
backend's, and ColossalAI's (colossalai.launch_from_torch in .venvs/colossal, which takes no timeout)."""

import subprocess
import sys

import pytest

from llmpipe import config as cfgmod
from tests.conftest import REPO

SCRIPT = """
import sys, torch, torch.distributed as dist
from llmpipe.backends.torch.train import Dist
Dist(group=True, timeout_minutes=int(sys.argv[1]) or None)
print(dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout)
"""


@pytest.mark.parametrize("minutes, shown", [(0, "0:30:00"), (45, "0:45:00")])
def test_timeout_reaches_the_process_group(minutes, shown):
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(minutes)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [shown]  # 0: torch's default (gloo's 30 minutes)


def test_key_is_validated_and_resume_neutral():
    from llmpipe.train.resume import train_settings

    cfg = cfgmod.validate({"train": {"dist_timeout_minutes": 60}})
    assert cfg["train"]["dist_timeout_minutes"] == 60
    assert "dist_timeout_minutes" not in train_settings(cfg)
    with pytest.raises(Exception, match="dist_timeout_minutes"):
        cfgmod.validate({"train": {"dist_timeout_minutes": 0}})


COLOSSAL = """
import sys, torch, torch.distributed as dist
from llmpipe.backends.colossal.train import init_distributed
init_distributed(int(sys.argv[1]) or None)
print(dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout)
"""


@pytest.mark.parametrize("minutes, shown", [(0, "0:30:00"), (45, "0:45:00")])
def test_colossal_timeout_reaches_the_process_group(minutes, shown):
    from tests.test_colossal import VENV_PY, need_env

    need_env()
    proc = subprocess.run(
        [str(VENV_PY), "-c", COLOSSAL, str(minutes)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1:] == [shown]
