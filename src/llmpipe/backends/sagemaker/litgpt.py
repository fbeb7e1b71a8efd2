"""lit-gpt checkpoint (lit_model.pth + model_config.yaml or lit_config.json) -> HF Llama folder.

Names as lit-gpt's own converter maps them (scripts/convert_hf_checkpoint.py, copy_weights_hf_llama):
wte -> embed_tokens, h.N.norm_1 / norm_2 -> input / post_attention_layernorm, attn.proj -> o_proj,
mlp.fc_1 / fc_2 / proj -> gate / up / down_proj, ln_f -> norm. The fused attention weight is
attn.qkv (litgpt >= 0.5: q rows, then k, then v) or attn.attn (older lit-gpt: per query group, that
group's q heads, then its k head, then its v head). Loaded with torch.load(weights_only=True).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml

CONFIG_FILES = ("model_config.yaml", "lit_config.json")


def read_config(folder: Path) -> dict:
    for name in CONFIG_FILES:
        p = folder / name
        if p.is_file():
            return yaml.safe_load(p.read_text()) if p.suffix == ".yaml" else json.loads(p.read_text())
    raise ValueError(f"{folder}: lit-gpt checkpoint without {' or '.join(CONFIG_FILES)}")


def split_qkv(w: torch.Tensor, key: str, n_head: int, n_groups: int, head: int):
    q_per_kv = n_head // n_groups
    if key.endswith("attn.qkv.weight"):
        return torch.split(w, [n_head * head, n_groups * head, n_groups * head])
    w = w.view(n_groups, q_per_kv + 2, head, -1)
    q, k, v = w[:, :q_per_kv], w[:, q_per_kv : q_per_kv + 1], w[:, q_per_kv + 1 :]
    return (t.reshape(-1, w.shape[-1]) for t in (q, k, v))


def hf_state_dict(sd: dict, c: dict) -> dict:
    n_head = c["n_head"]
    n_groups = c.get("n_query_groups") or n_head
    head = c.get("head_size") or c["n_embd"] // n_head
    simple = {
        "transformer.wte.weight": "model.embed_tokens.weight",
        "transformer.ln_f.weight": "model.norm.weight",
        "lm_head.weight": "lm_head.weight",
    }
    layer = {
        "norm_1.weight": "input_layernorm.weight",
        "norm_2.weight": "post_attention_layernorm.weight",
        "attn.proj.weight": "self_attn.o_proj.weight",
        "mlp.fc_1.weight": "mlp.gate_proj.weight",
        "mlp.fc_2.weight": "mlp.up_proj.weight",
        "mlp.proj.weight": "mlp.down_proj.weight",
    }
    out = {}
    for key, w in sd.items():
        if key in simple:
            out[simple[key]] = w
            continue
        parts = key.split(".", 3)
        if parts[:2] != ["transformer", "h"] or len(parts) < 4:
            raise ValueError(f"unexpected lit-gpt weight {key!r} (only Llama-style models are converted)")
        i, rest = parts[2], parts[3]
        if rest in ("attn.qkv.weight", "attn.attn.weight"):
            q, k, v = split_qkv(w, rest, n_head, n_groups, head)
            for name, t in zip("qkv", (q, k, v), strict=True):
                out[f"model.layers.{i}.self_attn.{name}_proj.weight"] = t.contiguous()
        elif rest in layer:
            out[f"model.layers.{i}.{layer[rest]}"] = w
        else:
            raise ValueError(f"unexpected lit-gpt weight {key!r} (only Llama-style models are converted)")
    return out


def tokenizer_ids(tokenizer_dir: Path | None) -> dict:
    """BOS / EOS / PAD ids of the run's tokenizer, as init-model sets them (lit-gpt's config has none)."""
    if tokenizer_dir is None:
        return {}
    from llmpipe.data.tokenizer import load_tokenizer
    from llmpipe.model.init import special_ids

    return special_ids(load_tokenizer(tokenizer_dir))


def convert(ckpt: Path, out: Path, tokenizer_dir: Path | None = None) -> None:
    """`tokenizer_dir`: the run's tokenizer, whose special token ids config.json and generation_config.json
    take (without it transformers' Llama defaults, BOS 1 / EOS 2)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = read_config(ckpt.parent)
    sd = torch.load(ckpt, map_location="cpu", weights_only=True)
    sd = sd.get("model", sd)
    hf = hf_state_dict(sd, c)
    tied = "lm_head.weight" not in hf or torch.equal(hf["lm_head.weight"], hf["model.embed_tokens.weight"])
    config = LlamaConfig(
        vocab_size=c.get("padded_vocab_size") or c["vocab_size"],
        hidden_size=c["n_embd"],
        intermediate_size=c["intermediate_size"],
        num_hidden_layers=c["n_layer"],
        num_attention_heads=c["n_head"],
        num_key_value_heads=c.get("n_query_groups") or c["n_head"],
        head_dim=c.get("head_size") or c["n_embd"] // c["n_head"],
        rms_norm_eps=float(c.get("norm_eps", 1e-5)),
        rope_theta=float(c.get("rope_base", 10000)),
        max_position_embeddings=c.get("block_size", 4096),
        tie_word_embeddings=tied,
        attention_bias=bool(c.get("bias", False)),
        mlp_bias=bool(c.get("bias", False)),
        **tokenizer_ids(tokenizer_dir),
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    if tied:
        hf.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(hf, strict=False, assign=True)
    missing = [m for m in missing if not (tied and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{ckpt}: lit-gpt -> HF mismatch; missing {missing[:5]}, unexpected {unexpected[:5]}")
    if tied:
        model.tie_weights()
    model.save_pretrained(str(out))
