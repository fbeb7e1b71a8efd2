"""config.json that older transformers read as we mean it.

transformers 5.x writes the RoPE settings only under `rope_parameters`; 4.x (NxD's examples pin 4.48.0,
Levanter its own 4.x) reads top-level `rope_theta` and `rope_scaling`, and without them falls back to
rope_theta 10000 and no scaling: a Llama-3 base would train with the wrong RoPE base. 5.x also names
the weights' dtype `dtype` where 4.x (and servers built on it, for dtype "auto") read `torch_dtype`. Every
config.json we write carries both spellings. Likewise 5.x names a fast tokenizer's class `TokenizersBackend` in
tokenizer_config.json, a class 4.x does not have, and for a model-specific class (LlamaTokenizer) 5.x
rebuilds the tokenizer from vocab and merges instead of reading tokenizer.json (other ids): the model
folders we hand on name `PreTrainedTokenizerFast`, which both read as tokenizer.json says (the data's ids).
"""

from __future__ import annotations

import json
from pathlib import Path


def with_legacy_keys(conf: dict) -> dict:
    """`conf` plus the 4.x names: torch_dtype from dtype, top-level rope_theta and rope_scaling from
    rope_parameters."""
    out = dict(conf)
    if out.get("dtype") is not None and out.get("torch_dtype") is None:
        out["torch_dtype"] = out["dtype"]
    rope = conf.get("rope_parameters")
    if not isinstance(rope, dict) or "rope_theta" not in rope:
        return out
    out["rope_theta"] = rope["rope_theta"]
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    out["rope_scaling"] = None if kind == "default" else {**scaling, "rope_type": kind, "type": kind}
    return out


def add_legacy_keys(folder: str | Path) -> None:
    """Rewrite folder/config.json in place with the 4.x keys (call inside an atomic write)."""
    path = Path(folder) / "config.json"
    conf = json.loads(path.read_text())
    path.write_text(json.dumps(with_legacy_keys(conf), indent=2, sort_keys=True) + "\n")


LEGACY_TOKENIZER_CLASS = "PreTrainedTokenizerFast"


def add_legacy_tokenizer_class(folder: str | Path) -> None:
    """Rewrite folder/tokenizer_config.json in place (if any, beside a tokenizer.json) with the one class both
    4.x and 5.x read from tokenizer.json as it is."""
    path = Path(folder) / "tokenizer_config.json"
    if not path.is_file() or not (Path(folder) / "tokenizer.json").is_file():
        return
    data = json.loads(path.read_text())
    if data.get("tokenizer_class") != LEGACY_TOKENIZER_CLASS:
        data["tokenizer_class"] = LEGACY_TOKENIZER_CLASS
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def legacy_readable(folder: str | Path) -> None:
    """A model folder older transformers read as we mean it: dtype, RoPE keys and tokenizer class (in place)."""
    if (Path(folder) / "config.json").is_file():
        add_legacy_keys(folder)
    add_legacy_tokenizer_class(folder)
