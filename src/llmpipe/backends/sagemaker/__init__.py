"""Backend "sagemaker": train on Amazon SageMaker with plain boto3 (no SageMaker SDK).

Mode "algorithm" (A): a marketplace pre-training algorithm (AlgorithmName ARN) reading the lit-gpt
packed view; mode "image" (B): a PyTorch container image running this package's torch trainer on the
hf view. Modules: aws (clients, S3 URIs), validate (AWS limits from botocore's model, checked before
any call), hyperparameters (mode A mapping, job names), upload (view -> S3, skip same sha256), jobs
(create or attach, wait + tail logs, stop, download), metrics (mode A's loss from its log lines), entry (mode B, inside the container), litgpt
(lit-gpt checkpoint -> HF Llama).
"""

from pathlib import Path

from llmpipe.backends import Backend


def _batch_problems(cfg: dict) -> list[str]:
    """Mode image: the global batch over the job's processes (parallel.nnodes instances x nproc_per_node, or
    one a GPU of the instance type as the entry point starts them), refused here as the torch backend refuses
    it, not inside the job on every attempt; unchecked for an instance type the hardware table lacks."""
    from llmpipe.parallelism import data_parallel_problems
    from llmpipe.plan.hardware import load_hardware

    if cfg["sagemaker"]["mode"] != "image":
        return []
    itype, nproc = cfg["sagemaker"]["instance_type"], cfg["parallel"]["nproc_per_node"]
    if not nproc:
        nproc = load_hardware({**cfg["plan"], "hardware": None}).get(itype.removeprefix("ml."), {}).get("devices")
        if not nproc:
            return []
    found = data_parallel_problems({**cfg, "parallel": {**cfg["parallel"], "nproc_per_node": nproc}})
    how = "" if cfg["parallel"]["nproc_per_node"] else f" (one process a GPU of {itype}: {nproc})"
    return [f"{line}{how}" for line in found]


def _checks(cfg: dict) -> list[str]:
    from llmpipe.backends.sagemaker.hyperparameters import settings_problems
    from llmpipe.parallelism import refuse

    only = {"tp": [1], "pp": [1], "zero": [0], "activation_checkpointing": [False]}  # data parallel (DDP)
    return refuse(cfg, "sagemaker", only) + settings_problems(cfg) + _batch_problems(cfg)


BACKEND = Backend(
    name="sagemaker",
    doc="Amazon SageMaker training jobs (marketplace algorithm or a PyTorch image), plain boto3",
    commands={"sagemaker-upload": "llmpipe.backends.sagemaker.upload", "sagemaker-train": "llmpipe.backends.sagemaker.jobs"},
    env="envs/sagemaker.yaml",
    section_schema=Path(__file__).with_name("schema.yaml"),
    checks=_checks,
)
