"""Plain PyTorch backend: transformers LlamaForCausalLM (SDPA), AdamW, DDP or FSDP2 under torchrun."""

from llmpipe.backends import Backend


def _checks(cfg: dict) -> list[str]:
    from llmpipe.parallelism import data_parallel_problems, refuse

    # zero 0: DDP, the whole model per process; zero 3: FSDP2 (fully_shard), weights, gradients and optimizer sharded
    out = refuse(cfg, "torch (DDP)", {"tp": [1], "pp": [1]})  # data parallel only
    out += refuse(cfg, "torch (DDP / FSDP2)", {"zero": [0, 3], "activation_checkpointing": [False, True]})
    out = out or data_parallel_problems(cfg)  # on a layout it can train
    if cfg["train"].get("document_masking") is True and not cfg.get("data", {}).get("segment_ids", True):
        out.append("'train.document_masking' true needs the view's segment_ids, but 'data.segment_ids' is false")
    return out


def _resume_sections(cfg: dict) -> dict:
    """FSDP2 checkpoints are DCP shards, DDP's whole safetensors: neither resumes the other."""
    return {"torch": {"zero": 3}} if (cfg.get("parallel", {}).get("zero") or 0) == 3 else {}


BACKEND = Backend(
    name="torch",
    doc="plain PyTorch: DDP or FSDP2 (parallel.zero 3) under torchrun, srun + torchrun per node on Slurm",
    commands={"torch-train": "llmpipe.backends.torch.train"},
    env="envs/torch.yaml",
    checks=_checks,
    parallel_defaults=lambda cfg: {"nproc_per_node": 1},
    document_masking=True,
    process_per_gpu=True,
    resume_sections=_resume_sections,
)
