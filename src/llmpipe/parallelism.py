"""The parallel layout a config trains with (nodes, processes per node, tp, pp, ZeRO, checkpointing),
read from the keys each backend really uses, so the plan and the trainer cannot disagree.

`plan.tp / pp / zero / activation_checkpointing / instances` are what-if overrides for the plan only;
`planned()` applies them and lists each one beside the trained value.
"""

from __future__ import annotations

WHAT_IF_KEYS = ("tp", "pp", "zero", "activation_checkpointing", "instances")


def trained(cfg: dict) -> dict:
    """The layout training runs with. processes_per_node None = one per device of the instance.
    activation_checkpointing: False, True (every layer) or "selective" (NxD: attention and MLP recomputed)."""
    t, backend = cfg["train"], cfg["train"]["backend"]
    out = {"backend": backend, "nodes": t["nnodes"], "processes_per_node": t["nproc"], "tp": 1, "pp": 1, "zero": 0,
           "activation_checkpointing": False, "keys": {"nodes": "train.nnodes", "processes_per_node": "train.nproc"}}
    if backend == "neuron":
        n = cfg["neuron"]
        zero1_script = n["script"] == "tp_zero1" or (n["script"] == "auto" and n["pp"] == 1)
        unselective = zero1_script  # tp_zero1 checkpoints every layer when selective is off; run_llama_nxd.py none
        out.update(processes_per_node=n["cores_per_node"], tp=n["tp"], pp=n["pp"], zero=1 if n["zero1"] else 0,
                   activation_checkpointing="selective" if n["selective_checkpoint"] else unselective)
        out["keys"].update(processes_per_node="neuron.cores_per_node", tp="neuron.tp", pp="neuron.pp",
                           zero="neuron.zero1", activation_checkpointing="neuron.selective_checkpoint")
    elif backend == "colossal":
        c = cfg["colossal"]
        zero = {"gemini": 3, "gemini_auto": 3, "zero2": 2, "ddp": 0}.get(c["plugin"], c["zero_stage"])
        if c["plugin"] == "3d":
            out.update(tp=c["tp"], pp=c["pp"])
            out["keys"].update(tp="colossal.tp", pp="colossal.pp")
        out.update(zero=zero, activation_checkpointing=c["gradient_checkpointing"])
        out["keys"].update(zero="colossal.plugin" if c["plugin"] != "3d" else "colossal.zero_stage",
                           activation_checkpointing="colossal.gradient_checkpointing")
    elif backend == "levanter":  # parameters, gradients and optimizer state sharded over the data axis (FSDP)
        out.update(processes_per_node=None, zero=3,
                   activation_checkpointing=cfg["levanter"]["gradient_checkpointing"])
        out["keys"].update(processes_per_node="every device of the slice", zero="Levanter FSDP",
                           activation_checkpointing="levanter.gradient_checkpointing")
    elif backend == "sagemaker":
        s = cfg["sagemaker"]
        out.update(nodes=s["instance_count"], processes_per_node=s["processes_per_instance"])
        out["keys"].update(nodes="sagemaker.instance_count", processes_per_node="sagemaker.processes_per_instance")
    return out


def planned(cfg: dict) -> tuple[dict, dict]:
    """(layout the plan prices, what-ifs {key: {"plan": value, "trained": value}}) for this config."""
    layout = trained(cfg)
    what_if = {}
    for key in WHAT_IF_KEYS:
        value = cfg["plan"].get(key)
        field = "nodes" if key == "instances" else key
        if value is not None and value != layout[field]:
            what_if[key] = {"plan": value, "trained": layout[field], "trained_key": layout["keys"].get(field, "")}
            layout[field] = value
    return layout, what_if


def tp_of(cfg: dict) -> tuple[int, str]:
    """The tensor-parallel degree the plan uses and the key it comes from."""
    layout, what_if = planned(cfg)
    if "tp" in what_if:
        return layout["tp"], "plan.tp"
    return layout["tp"], layout["keys"].get("tp", "tp")
