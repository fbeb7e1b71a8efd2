"""config.json that older transformers read as we mean it.

transformers 5.x writes the RoPE settings only under `rope_parameters`; 4.x (NxD's examples pin 4.48.0,
Levanter its own 4.x) reads top-level `rope_theta` and `rope_scaling`, and without them falls back to
rope_theta 10000 and no scaling: a Llama-3 base would train with the wrong RoPE base. Every config.json
we write carries both spellings.
"""

from __future__ import annotations

import json
from pathlib import Path


def with_legacy_rope(conf: dict) -> dict:
    """`conf` plus top-level rope_theta and rope_scaling (4.x names) taken from rope_parameters."""
    rope = conf.get("rope_parameters")
    if not isinstance(rope, dict) or "rope_theta" not in rope:
        return conf
    out = dict(conf)
    out["rope_theta"] = rope["rope_theta"]
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    out["rope_scaling"] = None if kind == "default" else {**scaling, "rope_type": kind, "type": kind}
    return out


def add_legacy_rope(folder: str | Path) -> None:
    """Rewrite folder/config.json in place with the 4.x RoPE keys (call inside an atomic write)."""
    path = Path(folder) / "config.json"
    conf = json.loads(path.read_text())
    path.write_text(json.dumps(with_legacy_rope(conf), indent=2, sort_keys=True) + "\n")
