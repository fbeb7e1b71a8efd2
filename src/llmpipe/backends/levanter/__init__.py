"""Backend "levanter": JAX training with Levanter (marin-levanter) for TPU VMs and pod slices (CPU JAX
works too). Runs in its own environment (.venvs/levanter or envs/levanter.yaml); rules/train_levanter.smk.

cache      our token store -> Levanter's cache (train/ and validation/), with Levanter's own writer
config     the shared llmpipe config -> Levanter's TrainLmConfig YAML (the mapping is documented there)
train      python -m levanter.main.train_lm with a fixed run id; HF export -> checkpoints/levanter/final
"""
