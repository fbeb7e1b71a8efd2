"""Plain PyTorch backend: transformers LlamaForCausalLM (SDPA), AdamW, DDP under torchrun."""

from llmpipe.backends import Backend


def _checks(cfg: dict) -> list[str]:
    from llmpipe.parallelism import data_parallel_problems, refuse

    only = {"tp": [1], "pp": [1], "zero": [0], "activation_checkpointing": [False]}  # DDP, whole model per process
    return refuse(cfg, "torch (DDP)", only) + data_parallel_problems(cfg)


BACKEND = Backend(
    name="torch",
    doc="plain PyTorch: DDP under torchrun, srun + torchrun per node on Slurm",
    commands={"torch-train": "llmpipe.backends.torch.train"},
    env="envs/torch.yaml",
    checks=_checks,
    parallel_defaults=lambda cfg: {"nproc_per_node": 1},
)
