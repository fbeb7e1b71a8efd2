"""Backend "levanter": JAX training with Levanter (marin-levanter) for TPU VMs and pod slices (CPU JAX
works too). Runs in its own environment (.venvs/levanter or envs/levanter.yaml); rules/train_levanter.smk.

cache      our token store -> Levanter's cache (train/ and validation/), with Levanter's own writer
config     the shared llmpipe config -> Levanter's TrainLmConfig YAML (the mapping is documented there)
train      python -m levanter.main.train_lm with a fixed run id; HF export -> checkpoints/levanter/final
"""

import importlib.util
import sys


def require_levanter() -> None:
    """Stop with a clear message when this interpreter has no Levanter (levanter.python points elsewhere)."""
    if importlib.util.find_spec("levanter") is None:
        raise SystemExit(f"levanter is not installed for {sys.executable}: set levanter.python to "
                         ".venvs/levanter/bin/python (built by scripts/setup-env-levanter.sh), or run with --use-conda")
