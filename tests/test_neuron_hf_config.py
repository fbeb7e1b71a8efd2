"""The config.json NxD's trainer loads (checkpoints/init, --training_config / --model_path) read by the
transformers NxD's Llama examples pin (4.48.0, installed from PyPI in .venvs/nxd-hf by
scripts/setup-env-nxd-hf.sh) gives exactly the base model's RoPE base and scaling, tied embeddings,
vocabulary and heads. The bases are NxD's own example shapes (tests/fixtures/nxd_configs), shrunk in
width and depth only so the real init-model can load and re-save them here."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llmpipe.model.hf_compat import with_legacy_keys
from tests.conftest import GPT2, REPO

NXD_PY = REPO / ".venvs" / "nxd-hf" / "bin" / "python"
FIXTURES = REPO / "tests" / "fixtures" / "nxd_configs"
MEANT = (
    "rope_theta",
    "rope_scaling",
    "tie_word_embeddings",
    "vocab_size",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_size",
    "num_hidden_layers",
    "max_position_embeddings",
)
READ = f"""
import json, sys
from transformers import LlamaConfig, __version__
c = LlamaConfig.from_pretrained(sys.argv[1])
out = {{k: getattr(c, k) for k in {MEANT!r}}}
out["version"] = __version__
print(json.dumps(out))
"""


def nxd_python(code: str, *args: str) -> str:
    """The last line `code` prints under transformers 4.48 (.venvs/nxd-hf); skips without it, fails in CI."""
    if not NXD_PY.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{NXD_PY} is missing: CI must build it with scripts/setup-env-nxd-hf.sh")
        pytest.skip(f"no transformers 4.48 side env: run scripts/setup-env-nxd-hf.sh to build {NXD_PY}")
    proc = subprocess.run([str(NXD_PY), "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


def read_as_nxd(folder: Path) -> dict:
    got = json.loads(nxd_python(READ, str(folder)))
    assert got.pop("version") == "4.48.0"
    return got


def meant(conf: dict) -> dict:
    """What 4.48 should read: the base's own values (rope_scaling compared on its scaling fields)."""
    out = {k: conf.get(k) for k in MEANT}
    out["rope_theta"] = float(conf.get("rope_theta", 10000.0))
    return out


def normalise(got: dict) -> dict:
    scaling = got["rope_scaling"]
    if scaling:
        scaling = {k: v for k, v in scaling.items() if k != "type"}  # 4.48 keeps both spellings
    return {**got, "rope_scaling": scaling}


def small_base(tmp_path: Path, name: str) -> tuple[Path, dict]:
    """NxD's example config with hidden / intermediate / layers shrunk (heads, vocab, RoPE, tying kept),
    saved by our transformers (5.x) as a real base model folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    conf = json.loads((FIXTURES / f"{name}.json").read_text())
    heads = conf["num_attention_heads"]
    small = {**conf, "hidden_size": 2 * heads, "intermediate_size": 32, "num_hidden_layers": 1}
    small = {k: v for k, v in small.items() if k not in ("sequence_parallel_enabled", "selective_checkpoint_enabled")}
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig.from_dict(copy.deepcopy(small)))  # 5.x edits rope_scaling in place
    base = tmp_path / f"base-{name}"
    model.save_pretrained(base)
    return base, small


@pytest.mark.parametrize("name", ["7B_config_llama2", "70B_config_llama3", "70B_config_llama3.1"])
def test_init_checkpoint_reads_in_nxd_transformers_as_meant(tmp_path, name, prepared):
    base, small = small_base(tmp_path, name)
    assert "rope_theta" not in json.loads((base / "config.json").read_text())  # 5.x writes rope_parameters only
    out = tmp_path / "init"
    # a tokenizer that fits the base's rows: GPT-2's 50,257 under Llama-3's 128,256, a small BPE under Llama-2's
    tok = GPT2 if small["vocab_size"] >= 50257 else prepared["tokenizer"]
    cfg = {"model": {"init_from": str(base)}, "train": {"seq_len": 256}}
    proc = subprocess.run(
        [sys.executable, "-m", "llmpipe", "init-model", "--config", json.dumps(cfg), "--tokenizer", str(tok), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the data is separated with the tokenizer's EOS: generation must stop there, not at the base's
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(str(tok)).eos_token_id
    for name in ("config.json", "generation_config.json"):
        assert json.loads((out / name).read_text())["eos_token_id"] == eos, name
    assert normalise(read_as_nxd(out)) == meant(small)


def test_without_the_legacy_keys_nxd_would_read_the_wrong_rope(tmp_path):
    """The failure this guards against, shown with the real 4.48: 5.x's file alone reads as theta 10000."""
    base, small = small_base(tmp_path, "70B_config_llama3.1")
    got = read_as_nxd(base)
    assert got["rope_theta"] == 10000.0 and got["rope_scaling"] is None
    assert small["rope_theta"] == 500000.0 and small["rope_scaling"]["rope_type"] == "llama3"


def test_new_model_from_preset_sizes_reads_as_meant(tmp_path):
    """No base: a new Llama of the 70B preset's RoPE base (shrunk sizes), as init-model writes it."""
    import yaml

    preset = yaml.safe_load((REPO / "config/presets/llama-3-70b-trn1.yaml").read_text())["model"]
    model = {
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 1,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "rope_theta": preset["rope_theta"],
        "tie_word_embeddings": True,
    }
    out = tmp_path / "init"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmpipe",
            "init-model",
            "--config",
            json.dumps({"model": model, "train": {"seq_len": 128}}),
            "--tokenizer",
            str(GPT2),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = read_as_nxd(out)
    # the tokenizer too: 5.x names its class TokenizersBackend, which 4.48 does not have
    text = "Hello world, the 1984 edition — café"
    read = "import sys\nfrom transformers import AutoTokenizer\nprint(AutoTokenizer.from_pretrained(sys.argv[1]).encode(sys.argv[2]))"
    from transformers import AutoTokenizer

    assert nxd_python(read, str(out), text) == str(AutoTokenizer.from_pretrained(str(GPT2)).encode(text))
    written = json.loads((out / "config.json").read_text())
    assert got["rope_theta"] == preset["rope_theta"] == written["rope_parameters"]["rope_theta"]
    assert got["rope_scaling"] is None and got["tie_word_embeddings"] is True
    assert (got["num_attention_heads"], got["num_key_value_heads"], got["vocab_size"]) == (8, 2, written["vocab_size"])


def test_legacy_keys_follow_rope_parameters():
    llama3 = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    out = with_legacy_keys({"rope_parameters": llama3, "vocab_size": 7})
    assert out["rope_theta"] == 500000.0 and out["vocab_size"] == 7
    assert out["rope_scaling"] == {**{k: v for k, v in llama3.items() if k != "rope_theta"}, "type": "llama3"}
    assert with_legacy_keys({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}})["rope_scaling"] is None
    assert with_legacy_keys({"rope_theta": 1e4}) == {"rope_theta": 1e4}  # already 4.x style: untouched


def test_export_dtype_reads_as_torch_dtype_in_4x(tmp_path, prepared):
    """transformers 5.x writes the weights' dtype as `dtype`; 4.48 (and servers on 4.x choosing dtype
    "auto") read `torch_dtype`: a bfloat16 export names bfloat16 under both."""
    from llmpipe.export import export

    export(prepared["init"], prepared["tokenizer"], tmp_path / "hf", "bfloat16")
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert written["dtype"] == "bfloat16"
    read = "import sys\nfrom transformers import LlamaConfig\nprint(LlamaConfig.from_pretrained(sys.argv[1]).torch_dtype)"
    assert nxd_python(read, str(tmp_path / "hf")) == "bfloat16"


LOAD_VIEW = """
import json, sys
import datasets, numpy as np
ds = datasets.load_from_disk(sys.argv[1]).with_format("numpy")  # NxD's training_utils: load_from_disk(data_dir)
print(json.dumps({"version": datasets.__version__, "columns": ds.column_names, "rows": ds.num_rows,
                  "sums": {c: int(np.asarray(ds[c], dtype=np.int64).sum()) for c in ds.column_names},
                  "first": np.asarray(ds[0]["input_ids"]).tolist()}))
"""


def test_hf_view_loads_in_the_datasets_nxd_pins(prepared):
    """NxD's trainer reads {view}/train with load_from_disk under datasets<=3.6.0 (envs/neuron.txt), which
    knows no feature type "List" (datasets 4+): the view declares "Sequence" and reads there exactly as here."""
    import datasets
    import numpy as np

    view = prepared["view"] / "train"
    got = json.loads(nxd_python(LOAD_VIEW, str(view)))
    ours = datasets.load_from_disk(str(view)).with_format("numpy")
    assert got["version"] == "3.6.0" and got["rows"] == ours.num_rows > 0
    assert got["columns"] == ours.column_names and {"input_ids", "labels", "attention_mask"} <= set(got["columns"])
    assert got["sums"] == {c: int(np.asarray(ours[c], dtype=np.int64).sum()) for c in ours.column_names}
    assert got["first"] == np.asarray(ours[0]["input_ids"]).tolist()
