"""`llmpipe export` tensor by tensor: the same weights, config and logits as transformers' save_pretrained of
the loaded model, split into files with an index when large, a damaged tensor refused, and memory bounded
by the largest tensor rather than the model (measured in a subprocess)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from llmpipe import export as export_mod
from llmpipe.model import weights as weights_mod
from llmpipe.model.folder import FolderError
from tests.conftest import big_llama, peak_growth


def logits(folder, ids):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True)
    with torch.no_grad():
        return model(ids).logits


def weights(folder) -> dict:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_streamed_export_equals_the_loaded_model_saved(prepared, tmp_path, dtype):
    from transformers import AutoModelForCausalLM

    init = prepared["init"]
    export_mod.export(init, prepared["tokenizer"], tmp_path / "hf", dtype)
    want = AutoModelForCausalLM.from_pretrained(init, dtype=torch.float32, local_files_only=True).to(export_mod.DTYPES[dtype])
    want.save_pretrained(tmp_path / "ref", safe_serialization=True)
    got, ref = weights(tmp_path / "hf"), weights(tmp_path / "ref")
    assert got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in ref)
    conf = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert conf["dtype"] == dtype and conf["vocab_size"] == json.loads((init / "config.json").read_text())["vocab_size"]
    assert json.loads((tmp_path / "hf" / "generation_config.json").read_text()) == json.loads(
        (tmp_path / "ref" / "generation_config.json").read_text()
    )
    assert (tmp_path / "hf" / "tokenizer.json").is_file()


def test_large_export_is_split_with_an_index_and_loads_the_same(prepared, tmp_path, monkeypatch):
    monkeypatch.setattr(weights_mod, "MAX_FILE_BYTES", 64 << 10)
    export_mod.export(prepared["init"], prepared["tokenizer"], tmp_path / "hf", "float32")
    files = sorted(p.name for p in (tmp_path / "hf").glob("model-*.safetensors"))
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert len(files) > 2 and sorted(set(index["weight_map"].values())) == files
    assert not (tmp_path / "hf" / "model.safetensors").exists()
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    assert torch.equal(logits(tmp_path / "hf", ids), logits(prepared["init"], ids))


def test_a_non_finite_weight_is_refused_and_nothing_written(prepared, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(prepared["init"], damaged)
    tensors = load_file(damaged / "model.safetensors")
    name = sorted(tensors)[3]
    tensors[name][0] = float("inf")
    save_file(tensors, damaged / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(SystemExit, match=rf"non-finite weights in {name}: refusing"):
        export_mod.export(damaged, prepared["tokenizer"], tmp_path / "hf", "float32")
    assert not (tmp_path / "hf").exists() and not list(tmp_path.glob(".hf*"))


def test_writing_stops_at_the_first_non_finite_tensor_and_the_rest_are_still_named(prepared, tmp_path, monkeypatch):
    """A 70B with a NaN in its first tensor must not write hundreds of GB to refuse it: the tensors after the
    first damaged one are read to be named, not cast and written."""
    damaged = tmp_path / "damaged"
    shutil.copytree(prepared["init"], damaged)
    order = list(weights_mod.tensors_of(weights_mod.weight_files(damaged), lambda n: False))
    tensors = load_file(damaged / "model.safetensors")
    first, last = order[1], order[-1]
    tensors[first][0] = float("nan")
    tensors[last][-1] = float("-inf")
    save_file(tensors, damaged / "model.safetensors", metadata={"format": "pt"})
    written, write = [], weights_mod.write_safetensors

    def counting(path, entries, pull, dtype):
        def taken():
            for name, fill in pull:
                written.append(name)
                yield name, fill

        return write(path, entries, taken(), dtype)

    monkeypatch.setattr(weights_mod, "write_safetensors", counting)
    with pytest.raises(SystemExit, match=rf"non-finite weights in {first}, {last}: refusing"):
        export_mod.export(damaged, prepared["tokenizer"], tmp_path / "hf", "float32")
    assert written == order[:2]
    assert not (tmp_path / "hf").exists() and not list(tmp_path.glob(".hf*"))


def test_a_weight_file_missing_from_the_index_is_named_by_each_reader(prepared, tmp_path, monkeypatch):
    from llmpipe.backends.neuron.hf_reader import HFCheckpoint
    from llmpipe.model.init import streamed

    monkeypatch.setattr(weights_mod, "MAX_FILE_BYTES", 64 << 10)
    export_mod.export(prepared["init"], prepared["tokenizer"], tmp_path / "split", "float32")
    files = sorted((tmp_path / "split").glob("model-*.safetensors"))
    files[1].unlink()
    want = rf"1 of the {len(files)} weight files its model.safetensors.index.json lists are missing \({files[1].name}\)"
    for read in (
        lambda: export_mod.export(tmp_path / "split", prepared["tokenizer"], tmp_path / "hf", "float32"),
        lambda: streamed(tmp_path / "split"),  # init-model (its CLI names a ValueError in one line)
        lambda: HFCheckpoint(tmp_path / "split"),  # neuron-shard
    ):
        with pytest.raises(FolderError, match=want):
            read()
    (tmp_path / "split" / "model.safetensors.index.json").write_text("[]")
    with pytest.raises(FolderError, match="not a safetensors index"):
        export_mod.export(tmp_path / "split", prepared["tokenizer"], tmp_path / "hf", "float32")
    assert not (tmp_path / "hf").exists()


MEASURE = """
import json, sys
import llmpipe.export
from transformers import AutoConfig, GenerationConfig
llmpipe.export.load_tokenizer(sys.argv[2])  # a fixed cost (transformers' tokenizer modules): before the baseline
AutoConfig.from_pretrained(sys.argv[1])


def status(key):  # kB
    return int(next(line for line in open("/proc/self/status") if line.startswith(key)).split()[1])


open("/proc/self/clear_refs", "w").write("5")  # resets the peak (VmHWM) to the RSS now
base = status("VmRSS")
llmpipe.export.export(sys.argv[1], sys.argv[2], sys.argv[3], "bfloat16")
print(json.dumps({"base_kb": base, "peak_kb": status("VmHWM")}))
"""


def test_memory_is_bounded_by_the_largest_tensor(prepared, tmp_path):
    """A 16-layer model of 87 M parameters (349 MB in fp32; its largest tensor 66 MB): the export's peak over
    its fixed costs stays under 3 x that tensor (121 MB here: the fp32 read, the bf16 buffer written, the
    finite check's mask), where loading the model whole took 582 MB."""
    params, largest = big_llama(tmp_path / "big")
    tok = tmp_path / "tok"  # a tokenizer of at most the model's 32000 rows
    shutil.copytree(prepared["tokenizer"], tok)
    grew = peak_growth(MEASURE, str(tmp_path / "big"), str(tok), str(tmp_path / "hf"))
    assert params * 4 > 5 * largest
    assert grew < 3 * largest, (grew / 1e6, largest / 1e6, params * 4 / 1e6)
    assert weights(tmp_path / "hf").keys() == weights(tmp_path / "big").keys()


@pytest.mark.parametrize("saved_by", ["step", "save_pretrained"])
def test_a_tied_model_exports_its_embedding_from_a_step_or_an_hf_folder(prepared, tmp_path, saved_by):
    """Tied embeddings: a torch step checkpoint (safetensors' save_model keeps the tied pair under
    lm_head.weight, the embedding's name in its metadata) and a save_pretrained folder (under the
    embedding's name) both export the trained embedding: same weights and logits as the model. Before, a
    step's export held neither name and loaded with a random embedding."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from llmpipe.backends.torch import checkpoint

    config = AutoConfig.from_pretrained(prepared["init"], local_files_only=True)
    config.tie_word_embeddings = True
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(config).float()
    with torch.no_grad():  # away from any initial value: the export must carry these
        model.get_input_embeddings().weight.normal_()
    if saved_by == "step":
        opt = torch.optim.AdamW(model.parameters())
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        trained = checkpoint.save(tmp_path / "ckpt", 5, model, opt, sched, {}, keep=1)
        assert "lm_head.weight" in load_file(trained / "model.safetensors")  # the name save_model keeps
    else:
        trained = tmp_path / "hf-saved"
        model.save_pretrained(trained)
    export_mod.export(trained, prepared["tokenizer"], tmp_path / "hf", "float32")
    got = weights(tmp_path / "hf")
    assert "lm_head.weight" not in got and torch.equal(got["model.embed_tokens.weight"], model.get_input_embeddings().weight)
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        assert torch.allclose(logits(tmp_path / "hf", ids), model(ids).logits, atol=1e-5)
    # with the embedding's tensor gone under every name: refused, nothing written
    only = {k: v for k, v in load_file(tmp_path / "hf" / "model.safetensors").items() if k != "model.embed_tokens.weight"}
    broken = tmp_path / "broken"
    shutil.copytree(tmp_path / "hf", broken)
    save_file(only, broken / "model.safetensors")
    with pytest.raises(SystemExit, match="ties its embeddings but holds no model.embed_tokens.weight"):
        export_mod.export(broken, prepared["tokenizer"], tmp_path / "out", "float32")
    assert not (tmp_path / "out").exists()
