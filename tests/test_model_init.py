import pytest
import torch
from safetensors.torch import load_file

from llmpipe.model.init import init_model
from tests.conftest import merge


def test_new_llama_matches_config_and_tokenizer(prepared):
    from transformers import AutoConfig, AutoTokenizer

    conf = AutoConfig.from_pretrained(prepared["init"])
    tok = AutoTokenizer.from_pretrained(prepared["init"])
    m = prepared["cfg"]["model"]
    assert conf.model_type == "llama"
    assert (conf.hidden_size, conf.num_hidden_layers, conf.num_key_value_heads) == (
        m["hidden_size"],
        m["num_hidden_layers"],
        m["num_key_value_heads"],
    )
    assert conf.vocab_size >= len(tok) and conf.vocab_size % m["vocab_multiple"] == 0
    assert conf.max_position_embeddings == prepared["cfg"]["train"]["seq_len"]
    assert conf.eos_token_id == tok.eos_token_id


def test_init_is_seeded(prepared, tmp_path):
    init_model(prepared["cfg"], prepared["tokenizer"], tmp_path / "again")
    a, b = load_file(str(prepared["init"] / "model.safetensors")), load_file(str(tmp_path / "again" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_continue_from_local_base_model_keeps_its_weights(prepared, tmp_path):
    cfg = merge(prepared["cfg"], {"model": {"init_from": str(prepared["init"]), "hidden_size": 64}, "train": {"seed": 99}})
    init_model(cfg, prepared["tokenizer"], tmp_path / "cont")
    a, b = load_file(str(prepared["init"] / "model.safetensors")), load_file(str(tmp_path / "cont" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_base_model_too_small_for_tokenizer(prepared, tmp_path):
    from llmpipe.data.tokenizer import copy_tokenizer
    from tests.conftest import GPT2

    copy_tokenizer(GPT2, tmp_path / "gpt2")
    cfg = merge(prepared["cfg"], {"model": {"init_from": str(prepared["init"])}})
    with pytest.raises(ValueError, match="embedding rows"):
        init_model(cfg, tmp_path / "gpt2", tmp_path / "x")


def test_bad_head_layout(prepared, tmp_path):
    cfg = merge(prepared["cfg"], {"model": {"num_attention_heads": 4, "num_key_value_heads": 3}})
    with pytest.raises(ValueError, match="num_key_value_heads"):
        init_model(cfg, prepared["tokenizer"], tmp_path / "x")
