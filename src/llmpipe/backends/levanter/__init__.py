"""Backend "levanter": JAX training with Levanter (marin-levanter) for TPU VMs and pod slices (CPU JAX
works too). Runs in its own environment (.venvs/levanter or envs/levanter.yaml); rules/train_levanter.smk.

cache      our token store -> Levanter's cache (train/ and validation/), with Levanter's own writer
config     the shared llmpipe config -> Levanter's TrainLmConfig YAML (the mapping is documented there)
train      python -m levanter.main.train_lm with a fixed run id; HF export -> checkpoints/levanter/final
"""

import importlib.util
import sys
from pathlib import Path

from llmpipe.backends import Backend


def require_levanter() -> None:
    """Stop with a clear message when this interpreter has no Levanter (levanter.python points elsewhere)."""
    if importlib.util.find_spec("levanter") is None:
        raise SystemExit(
            f"levanter is not installed for {sys.executable}: set levanter.python to "
            ".venvs/levanter/bin/python (built by scripts/setup-env-levanter.sh), or run with --use-conda"
        )


def _checks(cfg: dict) -> list[str]:
    from llmpipe.parallelism import refuse

    t = cfg["train"]
    out = refuse(cfg, "levanter (FSDP)", {"tp": [1], "pp": [1], "zero": [3], "activation_checkpointing": [True, False]})
    if t["global_batch_size"] % t["micro_batch_size"]:  # Levanter accumulates whole micro batches
        out.append(
            f"'train.global_batch_size' ({t['global_batch_size']}) is not a multiple of 'train.micro_batch_size' ({t['micro_batch_size']})"
        )
    return out


BACKEND = Backend(
    name="levanter",
    doc="JAX with Levanter on TPU VMs and pod slices (CPU JAX too), in its own environment",
    commands={f"levanter-{step}": f"llmpipe.backends.levanter.{step}" for step in ("cache", "config", "train")},
    env="envs/levanter.yaml",
    setup="scripts/setup-env-levanter.sh",
    env_requires=(
        "marin-levanter==0.2.20.dev202606180959",
        "jax==0.10.2",
        "jaxlib==0.10.2",
        "jsonschema",
        "orjson",
    ),  # as envs/ and scripts/setup-env-levanter.sh pin them
    section_schema=Path(__file__).with_name("schema.yaml"),
    checks=_checks,
    parallel_defaults=lambda cfg: {"zero": 3},  # FSDP over the data axis; nproc_per_node null: every device
)
