"""Backend "sagemaker": train on Amazon SageMaker with plain boto3 (no SageMaker SDK).

Mode "algorithm" (A): a marketplace pre-training algorithm (AlgorithmName ARN) reading the lit-gpt
packed view; mode "image" (B): a PyTorch container image running this package's torch trainer on the
hf view. Modules: aws (clients, S3 URIs), validate (AWS limits from botocore's model, checked before
any call), hyperparameters (mode A mapping, job names), upload (view -> S3, skip same sha256), jobs
(create or attach, wait + tail logs, stop, download), entry (mode B, inside the container), litgpt
(lit-gpt checkpoint -> HF Llama).
"""

from pathlib import Path

from llmpipe.backends import Backend


def _checks(cfg: dict) -> list[str]:
    from llmpipe.backends.sagemaker.hyperparameters import settings_problems
    from llmpipe.parallelism import refuse

    only = {"tp": [1], "pp": [1], "zero": [0], "activation_checkpointing": [False]}  # data parallel (DDP)
    return refuse(cfg, "sagemaker", only) + settings_problems(cfg)


BACKEND = Backend(
    name="sagemaker",
    doc="Amazon SageMaker training jobs (marketplace algorithm or a PyTorch image), plain boto3",
    commands={"sagemaker-upload": "llmpipe.backends.sagemaker.upload", "sagemaker-train": "llmpipe.backends.sagemaker.jobs"},
    env="envs/sagemaker.yaml",
    section_schema=Path(__file__).with_name("schema.yaml"),
    checks=_checks,
)
