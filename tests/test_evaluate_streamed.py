"""`llmpipe evaluate` at scale: eval.final_max_batches bounds the rows it scores, and eval.stream_weights reads
each module's weights from the safetensors files as the forward pass reaches it (llmpipe.model.streamed), so a
model larger than the memory there is still scores, to the same loss."""

import json
import shutil

import pytest
import torch

from llmpipe.evaluate import evaluate, streaming
from llmpipe.model.folder import FolderError
from llmpipe.model.streamed import float32_bytes, streamed_causal_lm
from llmpipe.report import _scored
from tests.conftest import big_llama, peak_growth


def _bf16_in_files(src, dst, tied: bool):
    """The model of `src` saved by save_pretrained in bfloat16, in several weight files (an index)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    if tied:
        model.config.tie_word_embeddings = True
        model.tie_weights()
    model.to(torch.bfloat16).save_pretrained(dst, max_shard_size="20KB")
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (src / f).is_file():
            shutil.copy(src / f, dst / f)
    return dst


@pytest.mark.parametrize("tied", [False, True])
def test_streamed_weights_score_exactly_the_whole_models_loss(prepared, tmp_path, tied):
    """The same loss to the last bit, document masking on, from bf16 weights in several files (and a tied
    head, held once in the files): streaming changes where the weights are, not the forward pass."""
    model = _bf16_in_files(prepared["init"], tmp_path / "m", tied)
    assert json.loads((model / "model.safetensors.index.json").read_text())["weight_map"]
    whole = evaluate(model, prepared["view"], tmp_path / "whole.json", 4, 1, stream_weights=False)
    streamed = evaluate(model, prepared["view"], tmp_path / "streamed.json", 4, 1, stream_weights=True)
    assert whole["document_masking"] is True and whole["tokens"] == streamed["tokens"] > 0
    assert streamed["val_loss"] == whole["val_loss"]


def test_streamed_model_holds_no_weight_between_modules(prepared):
    """Between forward passes every parameter is back on the meta device (nothing held); a forward pass gives
    the whole model's logits exactly."""
    from transformers import AutoModelForCausalLM

    cpu = torch.device("cpu")
    model = streamed_causal_lm(prepared["init"], cpu, "sdpa")
    whole = AutoModelForCausalLM.from_pretrained(prepared["init"], dtype=torch.float32, attn_implementation="sdpa").eval()
    ids = torch.randint(0, whole.config.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = model(input_ids=ids, use_cache=False).logits, whole(input_ids=ids, use_cache=False).logits
    assert torch.equal(got, want)
    assert {p.device.type for p in model.parameters()} == {"meta"}


def test_final_max_batches_scores_the_splits_first_rows(prepared, tmp_path):
    """eval.final_max_batches 1 with batch 2: the split's first 2 rows, the loss dataset_loss gives for them;
    eval.json says how many of the split's rows it scored."""
    import datasets
    from transformers import AutoModelForCausalLM

    from llmpipe.train.loss import dataset_loss

    val = datasets.load_from_disk(str(prepared["view"] / "val")).with_format("torch")
    assert len(val) > 2
    got = evaluate(prepared["init"], prepared["view"], tmp_path / "e.json", 2, 1, max_batches=1)
    assert got["sequences"] == 2 and got["split_sequences"] == len(val)
    model = AutoModelForCausalLM.from_pretrained(prepared["init"], dtype=torch.float32, attn_implementation="sdpa")
    want, tokens = dataset_loss(model, val.select(range(2)), 2, torch.device("cpu"), document_masking=True)
    assert got["val_loss"] == want and got["tokens"] == tokens
    assert _scored(got) == f"2 of the split's {len(val)}"  # the report's evaluation page
    assert evaluate(prepared["init"], prepared["view"], tmp_path / "all.json", 2, 1)["sequences"] == len(val)


def test_auto_streams_when_the_float32_model_is_over_half_the_memory(prepared, monkeypatch):
    need = float32_bytes(prepared["init"])
    assert need == 4 * sum(p.numel() for p in streamed_causal_lm(prepared["init"], torch.device("cpu"), "sdpa").parameters())
    cpu = torch.device("cpu")
    monkeypatch.setattr("llmpipe.evaluate.available_bytes", lambda device: 2 * need + 2)
    assert not streaming("auto", prepared["init"], cpu) and streaming(True, prepared["init"], cpu)
    monkeypatch.setattr("llmpipe.evaluate.available_bytes", lambda device: 2 * need - 2)
    assert streaming("auto", prepared["init"], cpu) and not streaming(False, prepared["init"], cpu)


def test_a_jobs_cgroup_limit_bounds_the_memory_there_is(monkeypatch):
    """A Slurm job's mem_mb (its cgroup's limit) counts when it is below what the machine has available."""
    from llmpipe.model import streamed

    cpu = torch.device("cpu")
    monkeypatch.setattr(streamed, "_cgroup_limit", lambda: None)
    machine = streamed.available_bytes(cpu)
    assert machine > 0
    monkeypatch.setattr(streamed, "_cgroup_limit", lambda: 1234)
    assert streamed.available_bytes(cpu) == 1234
    monkeypatch.setattr(streamed, "_cgroup_limit", lambda: 1 << 62)
    assert streamed.available_bytes(cpu) < 1 << 62


def test_a_parameter_the_files_lack_is_named(prepared, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "m"
    shutil.copytree(prepared["init"], folder)
    tensors = load_file(folder / "model.safetensors")
    gone = "model.layers.1.mlp.up_proj.weight"
    del tensors[gone]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(FolderError, match=f"cannot stream its weights: {gone} \\(not in the weight files\\)"):
        streamed_causal_lm(folder, torch.device("cpu"), "sdpa")


def test_a_model_transformers_converts_as_it_loads_is_refused_by_name(tmp_path):
    """Mixtral's experts are fused as transformers loads them (the files hold them one by one): reading its
    modules' tensors by name cannot work, and the reason is said (the check init-model's streaming shares)."""
    from transformers import AutoModelForCausalLM, MixtralConfig

    conf = MixtralConfig(
        vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, num_local_experts=2,
    )  # fmt: skip
    AutoModelForCausalLM.from_config(conf).save_pretrained(tmp_path / "mix")
    with pytest.raises(FolderError, match="cannot stream its weights: transformers converts MixtralForCausalLM"):
        streamed_causal_lm(tmp_path / "mix", torch.device("cpu"), "sdpa")


MEASURE = """
import json, sys
import datasets, transformers, llmpipe.evaluate
from transformers import AutoConfig
AutoConfig.from_pretrained(sys.argv[1])


def status(key):  # kB
    return int(next(line for line in open("/proc/self/status") if line.startswith(key)).split()[1])


open("/proc/self/clear_refs", "w").write("5")  # resets the peak (VmHWM) to the RSS now
base = status("VmRSS")
llmpipe.evaluate.evaluate(sys.argv[1], sys.argv[2], sys.argv[3], 2, 1, max_batches=1, stream_weights=sys.argv[4] == "1")
print(json.dumps({"base_kb": base, "peak_kb": status("VmHWM")}))
"""


def test_streamed_evaluate_memory_is_a_tensor_not_the_model(prepared, tmp_path):
    """A 16-layer model of 87 M parameters (349 MB in float32; its largest tensor 66 MB): evaluate's peak over
    its fixed costs streamed stays under 3 x that tensor (plus the batch's activations), where loading it whole
    grows by more than the float32 model."""
    params, largest = big_llama(tmp_path / "big")
    for f in prepared["init"].glob("tokenizer*"):  # the view's tokenizer (its ids are under 32000)
        shutil.copy(f, tmp_path / "big" / f.name)
    view = str(prepared["view"])
    whole = peak_growth(MEASURE, str(tmp_path / "big"), view, str(tmp_path / "w.json"), "0")
    streamed = peak_growth(MEASURE, str(tmp_path / "big"), view, str(tmp_path / "s.json"), "1")
    w, s = (json.loads((tmp_path / f"{x}.json").read_text()) for x in "ws")
    assert s["val_loss"] == w["val_loss"]
    assert whole > params * 4, (whole / 1e6, params * 4 / 1e6)
    assert streamed < 3 * largest, (streamed / 1e6, largest / 1e6, whole / 1e6)
