"""The one parallel layout (config section `parallel`), read by the plan and by every backend.

Each backend fills the values left null with its own (`Backend.parallel_defaults`) when the config is
validated, and refuses in its checks what it cannot train, naming the key. The keys these replace stop
with an error naming the new one (MOVED).
"""

from __future__ import annotations

KEYS = ("nnodes", "nproc_per_node", "tp", "pp", "zero", "activation_checkpointing")
# Old key -> the parallel key that replaced it.
MOVED = {
    "train.nproc": "parallel.nproc_per_node",
    "train.nnodes": "parallel.nnodes",
    "colossal.tp": "parallel.tp",
    "colossal.pp": "parallel.pp",
    "colossal.zero_stage": "parallel.zero",
    "colossal.gradient_checkpointing": "parallel.activation_checkpointing",
    "neuron.tp": "parallel.tp",
    "neuron.pp": "parallel.pp",
    "neuron.zero1": "parallel.zero",
    "neuron.selective_checkpoint": "parallel.activation_checkpointing",
    "neuron.cores_per_node": "parallel.nproc_per_node",
    "levanter.gradient_checkpointing": "parallel.activation_checkpointing",
    "sagemaker.instance_count": "parallel.nnodes",
    "sagemaker.processes_per_instance": "parallel.nproc_per_node",
    "plan.tp": "parallel.tp",
    "plan.pp": "parallel.pp",
    "plan.zero": "parallel.zero",
    "plan.activation_checkpointing": "parallel.activation_checkpointing",
    "plan.instances": "parallel.nnodes",
}


def moved_keys(config: dict) -> list[str]:
    """One message per old parallelism key in `config`, naming the key that replaced it."""
    out = []
    for old, new in MOVED.items():
        section, key = old.split(".")
        if isinstance(config.get(section), dict) and key in config[section]:
            out.append(f"'{old}' is now '{new}' (one parallel section for the plan and every backend)")
    return out


def resolve(cfg: dict) -> None:
    """Fill the parallel values left null with the backend's (in place; idempotent)."""
    from llmpipe import backends

    backend = backends.get(cfg["train"]["backend"])
    defaults = backend.parallel_defaults(cfg) if backend.parallel_defaults else {}
    p = cfg["parallel"]
    for key, value in defaults.items():
        if p[key] is None:
            p[key] = value
    for key in ("zero", "activation_checkpointing"):
        if p[key] is None:
            p[key] = {"zero": 0, "activation_checkpointing": False}[key]


def trained(cfg: dict) -> dict:
    """The layout training runs with, as the plan prices it. processes_per_node None = one per device."""
    p = cfg["parallel"]
    return {
        "backend": cfg["train"]["backend"],
        "nodes": p["nnodes"],
        "processes_per_node": p["nproc_per_node"],
        "tp": p["tp"],
        "pp": p["pp"],
        "zero": p["zero"],
        "activation_checkpointing": p["activation_checkpointing"],
    }


def refuse(cfg: dict, backend: str, allowed: dict) -> list[str]:
    """A problem per parallel key whose value `backend` cannot train; allowed: key -> accepted values."""
    p = cfg["parallel"]
    return [
        f"'parallel.{key}' {p[key]!r}: the {backend} backend trains only with {' or '.join(map(repr, ok))}"
        for key, ok in allowed.items()
        if p[key] is not None and p[key] not in ok
    ]


def data_parallel_problems(cfg: dict) -> list[str]:
    """The processes split into data ranks of tp x pp each, and the global batch evenly over those ranks."""
    t, p = cfg["train"], cfg["parallel"]
    nproc, tp, pp = p["nproc_per_node"] or 1, p["tp"] or 1, p["pp"] or 1
    world = nproc * p["nnodes"]
    if world % (tp * pp):
        return [
            f"'parallel.tp' x 'parallel.pp' ({tp} x {pp}) does not divide the {world} processes ('parallel.nproc_per_node'"
            f" x 'parallel.nnodes', {nproc} x {p['nnodes']})"
        ]
    per_step = t["micro_batch_size"] * world // (tp * pp)
    if t["global_batch_size"] % per_step:
        model = " / ('parallel.tp' x 'parallel.pp')" if tp * pp > 1 else ""
        return [
            f"'train.global_batch_size' ({t['global_batch_size']}) is not a multiple of 'train.micro_batch_size'"
            f" x 'parallel.nproc_per_node' x 'parallel.nnodes'{model} ({t['micro_batch_size']} x {p['nproc_per_node']} x "
            f"{p['nnodes']}{f' / ({tp} x {pp})' if model else ''})"
        ]
    return []
