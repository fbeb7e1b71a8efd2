"""AWS Trainium backend: neuronx-distributed (NxD) Llama trainer (run_llama_nxd.py, tp/pp family).

layout   NxD layout (tp, pp, kv replication, QKV module choice) checked against the model
shard    HF checkpoint -> NxD pretrained_weight rank files (streaming, one tensor at a time)
xser     reader of NxD training checkpoints (xser reference file + .tensors folder, or torch.save)
torchfile  torch.save files read (os.pread at each tensor's offset) and written one tensor at a time
merge    NxD rank files (a training step or the pretrained shards) -> HF safetensors + config + tokenizer
commands the precompile (neuron_parallel_compile) and training commands: env, flags, srun + torchrun
resume   the fingerprint neuron-train records beside NxD's steps, checked before it resumes them
resume_view  the rows a resumed tp_zero1 run reads (it skips none itself): a view of them beside the steps
"""

from pathlib import Path

from llmpipe.backends import Backend


def _checks(cfg: dict) -> list[str]:
    from llmpipe.backends.neuron.commands import config_problems

    return config_problems(cfg)


def _parallel_defaults(cfg: dict) -> dict:
    """One process per NeuronCore (commands.cores_per_node), ZeRO-1 and selective checkpointing as NxD's recipes."""
    from llmpipe.backends.neuron.commands import cores_per_node

    cores = cores_per_node(cfg)
    return {"nproc_per_node": cores, "zero": 1, "activation_checkpointing": "selective"}


def _resume_sections(cfg: dict) -> dict:
    from llmpipe.backends.neuron.resume import resume_sections

    return resume_sections(cfg)


def _newest_state(root: Path) -> tuple[Path, dict] | None:
    from llmpipe.backends.neuron.resume import newest_state

    return newest_state(root)


def _resume_refusal(cfg: dict, root: Path) -> str | None:
    """At parse time, for train.resume true; neuron-train checks the steps a restart's retry resumes too."""
    from llmpipe.backends.neuron.resume import dp_refusal

    return dp_refusal(cfg, root / "nxd") if cfg["train"]["resume"] else None


BACKEND = Backend(
    name="neuron",
    doc="AWS Trainium with neuronx-distributed's Llama trainers (tp/pp, tp + ZeRO-1) on Slurm",
    commands={
        f"neuron-{step}": f"llmpipe.backends.neuron.{module}"
        for step, module in (("shard", "shard"), ("merge", "merge"), ("precompile", "precompile"), ("train", "commands"))
    },
    env="envs/torch.yaml",
    setup="scripts/setup-env-neuron.sh",
    env_requires=(
        "neuronx-distributed==0.18.*",
        "torch-neuronx",
        "neuronx-cc==2.*",
        "transformers==4.48.0",
    ),  # as envs/ and scripts/setup-env-neuron.sh pin them
    env_tools=("neuron_parallel_compile",),
    section_schema=Path(__file__).with_name("schema.yaml"),
    checks=_checks,
    parallel_defaults=_parallel_defaults,
    resume_sections=_resume_sections,
    newest_state=_newest_state,
    resume_refusal=_resume_refusal,
)
