"""Mode image, inside the SageMaker container: run this package's torch trainer on the channels.

SageMaker lays out /opt/ml: input/config/hyperparameters.json (llmpipe_config = the train and eval
config as JSON, processes_per_instance), input/config/resourceconfig.json (hosts), input/data/<channel>
(train = hf view, init = starting checkpoint, code = this source), checkpoints/ (synced with the
job's CheckpointConfig S3 prefix, so a new attempt resumes), model/ (-> model.tar.gz: the HF-format
model), output/data/ (-> output.tar.gz: metrics.jsonl), output/failure (the FailureReason).
One process: python -m llmpipe torch-train; several or several hosts: torchrun with static rendezvous on
the first host. LLMPIPE_SM_ROOT replaces /opt/ml (tests).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections import deque
from pathlib import Path

log = logging.getLogger("llmpipe.sagemaker.entry")

MASTER_PORT = 29500
HELD_ENV = "LLMPIPE_TRAINER_LEASE"  # llmpipe.train.lock.HELD_ENV (this file runs before llmpipe is importable)
# Imported by the trainer; the image must bring them (network isolation: nothing installs at start).
REQUIRED = ("torch", "transformers", "datasets", "safetensors", "jsonschema", "yaml", "numpy", "tqdm")


def check_image() -> None:
    missing = [m for m in REQUIRED if importlib.util.find_spec(m) is None]
    if missing:
        raise RuntimeError(
            f"the training image lacks {', '.join(missing)}: use an image built FROM the PyTorch "
            f"container with llmpipe's pinned dependencies (pyproject.toml)"
        )


def command(root: Path, hp: dict, resource: dict, out: Path, python: str = sys.executable) -> list[str]:
    cfg = json.loads(hp["llmpipe_config"])
    nproc = hp.get("processes_per_instance", "auto")
    if nproc == "auto":
        import torch

        nproc = max(1, torch.cuda.device_count())
    nproc = int(nproc)
    hosts = resource.get("hosts", ["algo-1"])
    rank = hosts.index(resource.get("current_host", hosts[0]))
    data = root / "input" / "data"
    train = [
        "-m",
        "llmpipe",
        "torch-train",
        "--config",
        json.dumps(cfg),
        "--init",
        str(data / "init"),
        "--data",
        str(data / "train"),
        "--checkpoints",
        str(root / "checkpoints"),
        "--metrics",
        str(root / "output" / "data" / "metrics.jsonl"),
        "--out",
        str(out),
    ]
    if nproc == 1 and len(hosts) == 1:
        return [python, *train]
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(len(hosts)),
        "--node_rank",
        str(rank),
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        hosts[0],
        "--master_port",
        str(MASTER_PORT),
        *train,
    ]


class TrainerFailed(RuntimeError):
    """The trainer exited non-zero; the message holds its exit status and last error lines (not its command,
    which carries the whole config)."""


def run_teed(cmd: list[str], env: dict, keep: int = 12) -> None:
    """Run the trainer, its stderr passed on line by line (CloudWatch) and its last `keep` lines kept: on a
    non-zero exit, TrainerFailed with them, so the job's FailureReason says why."""
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, errors="replace")
    last: deque[str] = deque(maxlen=keep)
    for line in proc.stderr:
        sys.stderr.write(line)
        sys.stderr.flush()
        if line.strip():
            last.append(line.strip())
    if rc := proc.wait():
        raise TrainerFailed(f"torch-train exited {rc}: " + " | ".join(last))


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    root = Path(os.environ.get("LLMPIPE_SM_ROOT", "/opt/ml"))
    code = Path(__file__).resolve().parents[3]  # the channel folder holding llmpipe/
    try:
        check_image()
        hp = json.loads((root / "input" / "config" / "hyperparameters.json").read_text())
        rc_path = root / "input" / "config" / "resourceconfig.json"
        resource = json.loads(rc_path.read_text()) if rc_path.is_file() else {}
        (root / "output" / "data").mkdir(parents=True, exist_ok=True)
        (root / "checkpoints").mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="llmpipe-final-") as tmp:
            out = Path(tmp) / "final"
            cmd = command(root, hp, resource, out)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))}
            # the job is the run's one trainer: no lease file in checkpoints/, which SageMaker syncs to S3
            env[HELD_ENV] = str((root / "checkpoints").resolve())
            log.info("llmpipe from %s; running: %s", code, " ".join(cmd[:8]) + " ...")
            run_teed(cmd, env)
            if out.is_dir():  # written by global rank 0 only
                model = root / "model"
                model.mkdir(parents=True, exist_ok=True)
                for p in out.iterdir():
                    shutil.copy2(p, model / p.name)
                log.info("HF model -> %s: %s", model, ", ".join(sorted(p.name for p in model.iterdir())))
    except Exception as exc:
        (root / "output").mkdir(parents=True, exist_ok=True)
        why = str(exc) if isinstance(exc, TrainerFailed) else f"{type(exc).__name__}: {exc}"
        (root / "output" / "failure").write_text(
            why if len(why) <= 1000 else why[:200] + " ... " + why[-795:]
        )  # its end: the error
        raise
