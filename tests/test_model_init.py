import pytest
import torch
from safetensors.torch import load_file

from llmpipe.model.init import init_model
from tests.conftest import big_llama, merge, peak_growth


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


def _weights(folder) -> dict:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _base(prepared, tmp_path, dtype, tied, eos, shard, generation=True):
    """A base model folder from a small Llama: its dtype, tied embeddings or not, its own EOS id (another
    tokenizer's: the run's special ids must replace it), one file or several with an index; without
    generation_config.json, its generation settings in config.json (as older checkpoints keep them)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(prepared["init"], dtype=torch.float32, local_files_only=True)
    model.config.tie_word_embeddings = tied
    embedding = model.get_input_embeddings().weight
    model.lm_head.weight = embedding if tied else torch.nn.Parameter(embedding.detach().clone() + 0.5)
    if eos is not None:
        model.config.eos_token_id = model.generation_config.eos_token_id = eos
    folder = tmp_path / f"base-{dtype}-{tied}-{eos}-{shard}-{generation}"
    model.to(getattr(torch, dtype)).save_pretrained(folder, max_shard_size="30KB" if shard else "5GB")
    if not generation:
        import json

        (folder / "generation_config.json").unlink()
        conf = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**conf, "max_length": 77, "temperature": 0.5, "do_sample": True}))
    return folder


@pytest.mark.parametrize(
    "dtype, tied, eos, shard, generation",
    [
        ("float32", True, None, False, True),
        ("bfloat16", False, None, True, True),
        ("bfloat16", True, 7, True, True),
        ("bfloat16", False, None, False, False),
    ],
)
def test_a_safetensors_base_is_streamed_as_loading_it_whole_writes_it(
    prepared, tmp_path, monkeypatch, caplog, dtype, tied, eos, shard, generation
):
    """init-model copies a safetensors base tensor by tensor (a 70B in about 2-3x its largest tensor): the same
    float32 weights, config.json and generation_config.json as from_pretrained + save_pretrained of the whole
    model (the path it took before, and still takes for .bin weights)."""
    import json
    import logging

    from llmpipe.model import init as init_mod

    base = _base(prepared, tmp_path, dtype, tied, eos, shard, generation)
    assert shard == (base / "model.safetensors.index.json").is_file()
    cfg = merge(prepared["cfg"], {"model": {"init_from": str(base)}})
    with caplog.at_level(logging.INFO, logger="llmpipe.model.init"):
        init_model(cfg, prepared["tokenizer"], tmp_path / "streamed")
    assert "streamed into" in caplog.text
    monkeypatch.setattr(init_mod, "streamed", lambda base: None)
    init_model(cfg, prepared["tokenizer"], tmp_path / "whole")
    got, want = _weights(tmp_path / "streamed"), _weights(tmp_path / "whole")
    assert got.keys() == want.keys() and ("lm_head.weight" in got) == (not tied)
    assert all(got[k].dtype == torch.float32 and torch.equal(got[k], want[k]) for k in want)
    for name in ("config.json", "generation_config.json", "tokenizer.json"):
        a, b = (json.loads((tmp_path / out / name).read_text()) for out in ("streamed", "whole"))
        assert a == b, name
    if not generation:  # from_pretrained reads them from config.json: kept in generation_config.json
        kept = json.loads((tmp_path / "streamed" / "generation_config.json").read_text())
        assert (kept["max_length"], kept["temperature"], kept["do_sample"]) == (77, 0.5, True)
    run_eos = json.loads((prepared["init"] / "config.json").read_text())["eos_token_id"]
    assert json.loads((base / "config.json").read_text())["eos_token_id"] == (eos if eos is not None else run_eos)
    for name in ("config.json", "generation_config.json"):  # a base with another EOS takes the run's
        assert json.loads((tmp_path / "streamed" / name).read_text())["eos_token_id"] == run_eos


@pytest.mark.parametrize("extra", [torch.zeros(3), torch.ones(2, 2, dtype=torch.bool)])
def test_a_base_holding_other_tensors_than_its_model_is_loaded_whole(prepared, tmp_path, caplog, extra):
    """A tensor the model does not have (a float, or a mask: no weight at all) is left to from_pretrained, which
    ignores it, as before: loaded whole, the log saying why and what memory that takes."""
    import logging
    import shutil

    from safetensors.torch import save_file

    base = tmp_path / "odd"
    shutil.copytree(prepared["init"], base)
    tensors = load_file(base / "model.safetensors")
    tensors["model.extra.weight"] = extra
    save_file(tensors, base / "model.safetensors", metadata={"format": "pt"})
    cfg = merge(prepared["cfg"], {"model": {"init_from": str(base)}})
    with caplog.at_level(logging.INFO, logger="llmpipe.model.init"):
        init_model(cfg, prepared["tokenizer"], tmp_path / "out")
    import re

    params = sum(t.numel() for name, t in tensors.items() if name != "model.extra.weight")  # the model's, tied once
    (gb,) = re.findall(r"loaded whole, about ([\d.]+) GB", caplog.text)
    assert float(gb) == round(params * 8 / 1e9, 1) and "model.extra.weight" in caplog.text
    assert "streamed into" not in caplog.text
    got = _weights(tmp_path / "out")
    assert "model.extra.weight" not in got and torch.equal(got["model.norm.weight"], tensors["model.norm.weight"])


MEASURE = """
import json, sys
from llmpipe.model.init import init_model
from llmpipe.data.tokenizer import load_tokenizer
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
import torch
load_tokenizer(sys.argv[2])  # fixed costs (transformers' tokenizer and model modules): before the baseline
with torch.device("meta"):
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(sys.argv[1]))
cfg = json.loads(sys.argv[4])


def status(key):  # kB
    return int(next(line for line in open("/proc/self/status") if line.startswith(key)).split()[1])


open("/proc/self/clear_refs", "w").write("5")  # resets the peak (VmHWM) to the RSS now
base = status("VmRSS")
init_model(cfg, sys.argv[2], sys.argv[3])
print(json.dumps({"base_kb": base, "peak_kb": status("VmHWM")}))
"""


def test_init_from_a_base_is_bounded_by_its_largest_tensor(prepared, tmp_path):
    """MEMORY TEST: a 16-layer bf16 base of 87 M parameters (349 MB in float32, its largest tensor 66 MB in
    float32): init-model's peak over its fixed costs stays under 4x that tensor (measured 175 MB: the bf16
    read, the float32 buffer, the finite check's mask); loading it whole, as before, grew by 504 MB."""
    import json
    import shutil

    params, largest = big_llama(tmp_path / "big", "bfloat16", prepared["cfg"]["train"]["seq_len"])
    tok = tmp_path / "tok"  # the run's tokenizer: 4096 entries, under the base's 32000 rows
    shutil.copytree(prepared["tokenizer"], tok)
    cfg = merge(prepared["cfg"], {"model": {"init_from": str(tmp_path / "big")}})
    grew = peak_growth(MEASURE, str(tmp_path / "big"), str(tok), str(tmp_path / "init"), json.dumps(cfg))
    assert params * 4 > 5 * largest
    assert grew < 4 * largest, (grew / 1e6, largest / 1e6, params * 4 / 1e6)
    assert _weights(tmp_path / "init").keys() == _weights(tmp_path / "big").keys()
