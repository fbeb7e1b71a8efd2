"""What the plan is computed from: the model's shape (config, base model, checkpoint), the tokenizer
folder, and the data's size (packed view, token store); and which of this run's outputs match the config."""

from __future__ import annotations

import json
import logging
import math
import struct
from pathlib import Path

from llmpipe import config as cfgmod
from llmpipe.data.tokenizer import load_backend, tokenizer_info, tokenizer_sha256
from llmpipe.hub import is_hub_ref, parse_ref
from llmpipe.plan.arithmetic import Shape

log = logging.getLogger(__name__)


def checkpoint_parameters(folder: Path) -> int | None:
    """Parameters stored in a folder's *.safetensors (headers only), or None if it has none."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        with f.open("rb") as fh:
            header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
        total += sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    return total


def data_from_view(view_dir: Path, seq_len: int) -> dict:
    info = json.loads((view_dir / "view.json").read_text())
    if info["seq_len"] != seq_len:
        raise ValueError(f"{view_dir} was packed for seq_len {info['seq_len']}, train.seq_len is {seq_len}")
    train, val = info["train"], info["val"]
    return {
        "source": "packed view",
        "path": str(view_dir),
        "train_rows": train["rows"],
        "tokens_per_epoch": train["rows"] * seq_len,
        "train_tokens_packed": train["tokens_packed"],
        "dropped_tokens": train["dropped_tokens"],
        "val_tokens": val["tokens_packed"],
    }


def rows_for(tokens: int, seq_len: int, remainder: str) -> int:
    return tokens // seq_len if remainder == "drop" else -(-tokens // seq_len)


def data_from_store(manifest: Path, cfg: dict) -> dict:
    """From the token store's manifest.json (or the store folder holding it)."""
    manifest = manifest / "manifest.json" if manifest.is_dir() else manifest
    totals = json.loads(manifest.read_text())["totals"]
    seq_len = cfg["train"]["seq_len"]
    rows = rows_for(totals["train"]["tokens"], seq_len, cfg["data"]["remainder"])
    return {
        "source": "token store (before packing)",
        "path": str(manifest),
        "train_rows": rows,
        "tokens_per_epoch": rows * seq_len,
        "val_tokens": totals["val"]["tokens"],
    }


def tokenizer_folder(cfg: dict) -> Path | None:
    """The local folder holding the configured tokenizer: tokenizer.source itself, or for a Hub id this
    run's tokenizer stage output if it downloaded that repo and revision (None: not trained/fetched yet)."""
    source = cfg["tokenizer"]["source"]
    if source == "base":  # the base model's own tokenizer: its folder once there
        found = cfgmod.base_config_json(cfg) if cfg["model"]["init_from"] else None
        return found.parent if found is not None else None
    if not is_hub_ref(source):
        return None if source == "train" else Path(source)
    run_tok = cfgmod.run_dir(cfg) / "tokenizer"
    record = run_tok / "hub.json"
    if not record.is_file():
        return None
    got = json.loads(record.read_text())
    repo_id, rev = parse_ref(source)
    return run_tok if (got["repo_id"], got["revision"]) == (repo_id, rev or "main") else None


def _tokenizer_matches(cfg: dict, vocab_size: int, sha256: str) -> bool:
    """Whether a tokenizer (its vocab size and tokenizer.json sha256) is the one this config asks for."""
    if cfg["tokenizer"]["source"] == "train":
        return vocab_size == cfg["tokenizer"]["vocab_size"]
    folder = tokenizer_folder(cfg)
    return folder is not None and sha256 == tokenizer_sha256(folder)


def shape_from_config(cfg: dict, tokenizer_dir: Path | None) -> tuple[Shape, str]:
    """The model the init rule would build: config sizes, the tokenizer's vocab rounded up to vocab_multiple.
    With a base model (model.init_from): its config.json, or the config's sizes until it is downloaded."""
    m = cfg["model"]
    if m["init_from"]:
        found = cfgmod.base_config_json(cfg)
        if found is not None:
            return Shape.from_hf(json.loads(found.read_text())), str(found)
        return (
            sized_shape(m, cfg["tokenizer"]["vocab_size"]),
            f"model sizes and tokenizer.vocab_size from the config ({m['init_from']} not downloaded yet)",
        )
    if cfg["tokenizer"]["source"] != "train" or tokenizer_dir is not None:
        tok = tokenizer_dir or tokenizer_folder(cfg)
        if tok is None:
            raise ValueError(
                f"tokenizer.source {cfg['tokenizer']['source']!r} is a Hub id not downloaded yet: run "
                "the tokenizer stage first (snakemake <results>/<run>/tokenizer) and plan again"
            )
        vocab, where = load_backend(tok).get_vocab_size(with_added_tokens=True), str(tok)
    else:
        vocab, where = cfg["tokenizer"]["vocab_size"], "tokenizer.vocab_size"
    return sized_shape(m, vocab), f"model: sizes, vocab from {where}"


def sized_shape(m: dict, vocab: int) -> Shape:
    """The Llama of the config's model.* sizes, its vocab rounded up to model.vocab_multiple."""
    heads = m["num_attention_heads"]
    return Shape(
        -(-vocab // m["vocab_multiple"]) * m["vocab_multiple"],
        m["hidden_size"],
        m["intermediate_size"],
        m["num_hidden_layers"],
        heads,
        m["num_key_value_heads"],
        m["hidden_size"] // heads,
        m["tie_word_embeddings"],
    )


def run_outputs(cfg: dict) -> dict:
    """This run's tokenizer, token store, view and init checkpoint, where they exist and match the
    config (an overlay such as a preset may plan another tokenizer, seq_len or model)."""
    run = cfgmod.run_dir(cfg)
    found = {"tokenizer": None, "store": None, "view": None, "model": None}
    tok = run / "tokenizer"
    if (tok / "tokenizer.json").is_file():
        info = tokenizer_info(tok)
        found["tokenizer"] = tok if _tokenizer_matches(cfg, info.vocab_size, info.sha256) else None
    manifest = run / "data" / "tokens" / "manifest.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        if _tokenizer_matches(cfg, m["tokenizer"]["vocab_size"], m["tokenizer"]["sha256"]):
            found["store"] = manifest
            view = run / "data" / "views" / "hf"
            if (view / "view.json").is_file():
                v = json.loads((view / "view.json").read_text())
                if v["seq_len"] == cfg["train"]["seq_len"] and v["store_fingerprint"] == m["fingerprint"]:
                    found["view"] = view
    init = run / "checkpoints" / "init" / "config.json"
    if init.is_file():
        want, _ = shape_from_config(cfg, found["tokenizer"])
        if Shape.from_hf(json.loads(init.read_text())) == want:
            found["model"] = init.parent
    skipped = [k for k, v in found.items() if v is None]
    if skipped:
        log.info("not using this run's %s (absent or built for another config)", ", ".join(skipped))
    return found
