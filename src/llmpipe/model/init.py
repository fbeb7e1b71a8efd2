"""init-model: the starting HF checkpoint (a new Llama from config sizes, or a local base model)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

from llmpipe import config as cfgmod
from llmpipe.data.tokenizer import copy_tokenizer_files, load_tokenizer
from llmpipe.io import atomic_path
from llmpipe.model.hf_compat import legacy_readable

log = logging.getLogger(__name__)


def special_ids(tok) -> dict:
    """A tokenizer's BOS / EOS / PAD ids as config.json and generation_config.json name them."""
    return {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}


def llama_config(model_cfg: dict, vocab_size: int, seq_len: int, tok):
    from transformers import LlamaConfig

    heads, kv = model_cfg["num_attention_heads"], model_cfg["num_key_value_heads"]
    if model_cfg["hidden_size"] % heads or heads % kv:
        raise ValueError(
            f"model: hidden_size {model_cfg['hidden_size']} must divide by num_attention_heads {heads}, "
            f"and num_attention_heads by num_key_value_heads {kv}"
        )
    multiple = model_cfg["vocab_multiple"]
    return LlamaConfig(
        vocab_size=-(-vocab_size // multiple) * multiple,
        hidden_size=model_cfg["hidden_size"],
        intermediate_size=model_cfg["intermediate_size"],
        num_hidden_layers=model_cfg["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=seq_len,
        rope_theta=model_cfg["rope_theta"],
        rms_norm_eps=model_cfg["rms_norm_eps"],
        tie_word_embeddings=model_cfg["tie_word_embeddings"],
        initializer_range=model_cfg["initializer_range"],
        **special_ids(tok),
    )


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def weights_format(base: str | Path, allow_pickle: bool) -> bool:
    """True if `base` has safetensors weights; False if only pickle weights and model.allow_pickle
    allows them; else a ValueError naming the files (unpickling can run arbitrary code)."""
    base = Path(base)
    if not base.is_dir() or any(base.glob("*.safetensors")):
        return True
    pickles = sorted(p.name for p in base.iterdir() if p.name.endswith(PICKLE_SUFFIXES))
    if pickles and not allow_pickle:
        raise ValueError(
            f"model.init_from {base} has only pickle weights ({', '.join(pickles)}), which can run code when loaded: "
            "convert them to safetensors, or set model.allow_pickle: true to load them with "
            "torch.load(weights_only=True) (tensors only)"
        )
    return not pickles


def load_base(base: str | Path, allow_pickle: bool):
    """A local base model: safetensors, or (allowed) pickle weights restricted to tensors; never remote code."""
    import pickle

    from transformers import AutoModelForCausalLM

    use_safetensors = weights_format(base, allow_pickle)
    try:
        return AutoModelForCausalLM.from_pretrained(
            str(base),
            trust_remote_code=False,
            dtype=torch.float32,
            use_safetensors=use_safetensors,
            weights_only=True,
            local_files_only=True,
        )
    except (pickle.UnpicklingError, OSError, RuntimeError) as exc:
        if use_safetensors or not (isinstance(exc, pickle.UnpicklingError) or "Weights only load failed" in str(exc)):
            raise
        raise ValueError(
            f"model.init_from {base}: refusing its pickle weights: they hold objects other than tensors, "
            "which torch.load(weights_only=True) does not load"
        ) from None


def match_special_tokens(model, tok) -> None:
    """A base trained on with another tokenizer (one whose EOS is not among the base's): config and generation
    config take that tokenizer's BOS / EOS / PAD ids, the ones the data is separated with, so generation stops
    where the model learned to. With the base's own tokenizer its ids stay (Llama-3.1's list of EOS ids too)."""
    eos = model.config.eos_token_id
    if tok.eos_token_id is None or tok.eos_token_id in (eos if isinstance(eos, list) else [eos]):
        return
    ids = special_ids(tok)
    log.warning("the tokenizer is not the base model's: special token ids %s (the base had eos %s)", ids, eos)
    for key, value in ids.items():
        setattr(model.config, key, value)
        if model.generation_config is not None:
            setattr(model.generation_config, key, value)


def init_model(cfg: dict, tokenizer_dir: str | Path, out_dir: str | Path) -> None:
    from transformers import LlamaForCausalLM

    base = cfg["model"]["init_from"]
    if base:
        weights_format(base, cfg["model"]["allow_pickle"])  # refuse pickles before any heavy work
    tok = load_tokenizer(tokenizer_dir)
    if base:
        model = load_base(base, cfg["model"]["allow_pickle"])
        rows = model.get_input_embeddings().weight.shape[0]
        if rows < len(tok):
            raise ValueError(f"model.init_from {base} has {rows} embedding rows but the tokenizer has {len(tok)} tokens")
        if model.config.max_position_embeddings < cfg["train"]["seq_len"]:  # a Hub base: known only now
            from llmpipe.config import seq_len_past_base

            raise ValueError(seq_len_past_base(cfg["train"]["seq_len"], model.config.max_position_embeddings))
        match_special_tokens(model, tok)
        log.info("continuing from %s (%d parameters)", base, model.num_parameters())
    else:
        torch.manual_seed(cfg["train"]["seed"])
        model = LlamaForCausalLM(llama_config(cfg["model"], len(tok), cfg["train"]["seq_len"], tok))
        log.info("new Llama: %d parameters, vocab %d", model.num_parameters(), model.config.vocab_size)
    with atomic_path(out_dir) as tmp:
        model.save_pretrained(str(tmp))
        copy_tokenizer_files(tokenizer_dir, tmp)
        legacy_readable(tmp)  # what NxD's transformers 4.48 reads (llmpipe/model/hf_compat.py)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe init-model", description=__doc__)
    p.add_argument("--config", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        init_model(cfgmod.load(args.config), args.tokenizer, args.out)
    except ValueError as exc:  # a base that does not fit the run (embedding rows, positions), named
        raise SystemExit(f"llmpipe init-model: {exc}") from None
