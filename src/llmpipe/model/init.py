"""init-model: the starting HF checkpoint (a new Llama from config sizes, or a local base model)."""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path

import torch

from llmpipe import config as cfgmod
from llmpipe.data.tokenizer import copy_tokenizer_files, load_tokenizer
from llmpipe.io import atomic_path
from llmpipe.model.hf_compat import legacy_readable
from llmpipe.model.safetensors_out import not_weight
from llmpipe.model.weights import Found, copy_weights, generation_config, tensors_of, weight_files, why_not_by_name

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


SAVE_FILE_BYTES = 50 * 10**9  # save_pretrained's max_shard_size ("50GB"), the files of a base loaded whole
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


def match_special_tokens(config, generation, tok) -> None:
    """A base trained on with another tokenizer (one whose EOS is not among the base's): config and generation
    config take that tokenizer's BOS / EOS / PAD ids, the ones the data is separated with, so generation stops
    where the model learned to. With the base's own tokenizer its ids stay (Llama-3.1's list of EOS ids too)."""
    eos = config.eos_token_id
    if tok.eos_token_id is None or tok.eos_token_id in (eos if isinstance(eos, list) else [eos]):
        return
    ids = special_ids(tok)
    log.warning("the tokenizer is not the base model's: special token ids %s (the base had eos %s)", ids, eos)
    for key, value in ids.items():
        setattr(config, key, value)
        if generation is not None:
            setattr(generation, key, value)


class Streamed:
    """A base whose safetensors hold exactly the weights of the model its config.json describes (names and
    shapes, held against that model built on the meta device: no memory): copied tensor by tensor into
    float32, as from_pretrained + save_pretrained would write it, in about 2-3x its largest tensor (measured 2.7x)."""

    def __init__(self, config, model, found: Found):
        self.config, self.found = config, found
        self.architecture = type(model).__name__
        self.rows = model.get_input_embeddings().weight.shape[0]
        self.parameters = sum(math.prod(info[3]) for info in found.values())


def streamed(base: str | Path) -> Streamed | None:
    """The base as a Streamed, or None where it must be loaded whole (.bin weights, tensors other than its
    model's, persistent buffers, a model whose weights transformers renames or converts as it loads): why is
    logged, with the memory that takes."""
    from transformers import AutoConfig, AutoModelForCausalLM

    files = weight_files(Path(base))
    if files is None:
        return None
    config = AutoConfig.from_pretrained(str(base), trust_remote_code=False, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    params = {name: tuple(p.shape) for name, p in model.named_parameters()}  # tied weights once, under the first name

    def whole(why: str) -> None:
        size = sum(math.prod(shape) for shape in params.values()) * 8 / 1e9
        log.warning("model.init_from %s: loaded whole, about %.1f GB (%s)", base, size, why)

    if why := why_not_by_name(model):
        return whole(why)
    tied = set(model.state_dict()) - set(params)  # a tied weight's other names (lm_head.weight)
    try:
        found = tensors_of(files, lambda name: not_weight(name) or name in tied)
    except ValueError as exc:  # a tensor that is not a float weight (a mask, position ids, quantized weights)
        return whole(str(exc))
    if {n: info[3] for n, info in found.items()} != params:
        missing, extra = sorted(set(params) - set(found)), sorted(set(found) - set(params))
        return whole(f"names or shapes not its model's: missing {missing[:3]}, extra {extra[:3]}")
    return Streamed(config, model, found)


def init_model(cfg: dict, tokenizer_dir: str | Path, out_dir: str | Path) -> None:
    from transformers import LlamaForCausalLM

    base = cfg["model"]["init_from"]
    if base:
        weights_format(base, cfg["model"]["allow_pickle"])  # refuse pickles before any heavy work
    tok = load_tokenizer(tokenizer_dir)
    stream = streamed(base) if base else None
    if stream is not None:
        return init_streamed(cfg, base, stream, tok, tokenizer_dir, out_dir)
    if base:
        model = load_base(base, cfg["model"]["allow_pickle"])
        check_base(cfg, base, model.get_input_embeddings().weight.shape[0], model.config, tok)
        match_special_tokens(model.config, model.generation_config, tok)
        log.info("continuing from %s (%d parameters, loaded whole)", base, model.num_parameters())
    else:
        torch.manual_seed(cfg["train"]["seed"])
        model = LlamaForCausalLM(llama_config(cfg["model"], len(tok), cfg["train"]["seq_len"], tok))
        log.info("new Llama: %d parameters, vocab %d", model.num_parameters(), model.config.vocab_size)
    with atomic_path(out_dir) as tmp:
        model.save_pretrained(str(tmp))
        copy_tokenizer_files(tokenizer_dir, tmp)
        legacy_readable(tmp)  # what NxD's transformers 4.48 reads (llmpipe/model/hf_compat.py)


def check_base(cfg: dict, base, rows: int, config, tok) -> None:
    """The base fits the run: an embedding row per token, positions for train.seq_len."""
    if rows < len(tok):
        raise ValueError(f"model.init_from {base} has {rows} embedding rows but the tokenizer has {len(tok)} tokens")
    if config.max_position_embeddings < cfg["train"]["seq_len"]:  # a Hub base: known only now
        from llmpipe.config import seq_len_past_base

        raise ValueError(seq_len_past_base(cfg["train"]["seq_len"], config.max_position_embeddings))


def init_streamed(cfg: dict, base, stream: Streamed, tok, tokenizer_dir, out_dir) -> None:
    """The base's weights in float32, tensor by tensor; config.json and generation_config.json as
    save_pretrained writes them for the loaded model (its class, float32, the run's special ids)."""
    config = stream.config
    check_base(cfg, base, stream.rows, config, tok)
    generation = generation_config(base)
    match_special_tokens(config, generation, tok)
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        files, bad = copy_weights(stream.found, tmp, torch.float32, SAVE_FILE_BYTES)
        if bad:
            more = f" (+{len(bad) - 5} more)" if len(bad) > 5 else ""
            raise ValueError(
                f"model.init_from {base} has non-finite weights in {', '.join(bad[:5])}{more}: refusing a damaged base"
            )
        config.dtype, config.architectures = torch.float32, [stream.architecture]
        config.save_pretrained(str(tmp))
        generation.save_pretrained(str(tmp))
        copy_tokenizer_files(tokenizer_dir, tmp)
        legacy_readable(tmp)
    log.info("continuing from %s (%d parameters, streamed into %d file(s))", base, stream.parameters, files)


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
