"""Loading untrusted model folders: pickle weights and remote code.

- A base model (model.init_from) with only pickle weights is refused, naming model.allow_pickle;
  with it set, tensor-only pickles load through torch.load(weights_only=True) and a pickle carrying
  an arbitrary object is still refused. The object's payload (it would create a file) never runs.
- A tokenizer or model folder asking for its own code (auto_map + a .py file that would create a
  file) loads without running it: trust_remote_code stays off.
- Every torch.load in src/ passes weights_only=True; no call passes trust_remote_code=True or
  weights_only=False, and nothing calls pickle.load(s) (a scan of the source's syntax tree).
"""

import ast
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import REPO


class Payload:
    """Unpickling this runs `touch <marker>` (what a malicious checkpoint would do)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def base_models(prepared, tmp_path_factory):
    """Three copies of a tiny Llama without safetensors: tensors only, + an arbitrary object, and the reference."""
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("bases")
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=576,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
    )
    model.save_pretrained(str(root / "ref"))
    state = load_file(str(root / "ref" / "model.safetensors"))
    marker = root / "PAYLOAD_RAN"
    for name, extra in (("tensors", {}), ("evil", {"evil": Payload(marker)})):
        (root / name).mkdir()
        shutil.copy(root / "ref" / "config.json", root / name / "config.json")
        torch.save({**state, **extra}, root / name / "pytorch_model.bin")
    return {"root": root, "state": state, "marker": marker}


def init_model(prepared, base, out, allow_pickle):
    cfg = {**prepared["cfg"], "model": {**prepared["cfg"]["model"], "init_from": str(base), "allow_pickle": allow_pickle}}
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "llmpipe",
            "init-model",
            "--config",
            json.dumps(cfg),
            "--tokenizer",
            str(prepared["tokenizer"]),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
    )


def test_pickle_weights_refused_unless_allowed(prepared, base_models, tmp_path):
    from llmpipe.model.init import init_model as init_in_process
    from llmpipe.model.init import load_base

    root, marker = base_models["root"], base_models["marker"]
    # through the CLI: refused before anything is written, with the key to set
    proc = init_model(prepared, root / "evil", tmp_path / "evil", allow_pickle=False)
    assert proc.returncode != 0 and "model.allow_pickle" in proc.stderr and "pytorch_model.bin" in proc.stderr
    assert not (tmp_path / "evil").exists()
    with pytest.raises(ValueError, match="model.allow_pickle"):
        load_base(root / "tensors", allow_pickle=False)
    with pytest.raises(ValueError, match="objects other than tensors"):
        load_base(root / "evil", allow_pickle=True)
    assert not marker.exists()  # the payload never ran
    # allowed and tensors only: it loads, and the init checkpoint (safetensors) holds exactly those tensors
    cfg = {**prepared["cfg"], "model": {**prepared["cfg"]["model"], "init_from": str(root / "tensors"), "allow_pickle": True}}
    init_in_process(cfg, prepared["tokenizer"], tmp_path / "ok")
    got = load_file(str(tmp_path / "ok" / "model.safetensors"))
    assert got.keys() == base_models["state"].keys()
    assert all(torch.equal(got[k], base_models["state"][k]) for k in got)


def remote_code_folder(src, dst, marker, kind):
    """A copy of `src` whose config asks for a local class that creates `marker` on import."""
    shutil.copytree(src, dst)
    (dst / "custom.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
        "from transformers import PreTrainedTokenizerFast as CustomTokenizer\n"
        "from transformers import LlamaConfig as CustomConfig\n"
        "from transformers import LlamaForCausalLM as CustomModel\n"
    )
    name = "tokenizer_config.json" if kind == "tokenizer" else "config.json"
    conf = json.loads((dst / name).read_text())
    conf["auto_map"] = (
        {"AutoTokenizer": ["custom.CustomTokenizer", "custom.CustomTokenizer"]}
        if kind == "tokenizer"
        else {"AutoConfig": "custom.CustomConfig", "AutoModelForCausalLM": "custom.CustomModel"}
    )
    (dst / name).write_text(json.dumps(conf))


def test_remote_code_never_runs(prepared, base_models, tmp_path):
    from llmpipe.data.tokenizer import load_tokenizer
    from llmpipe.model.init import load_base

    marker = tmp_path / "REMOTE_CODE_RAN"
    remote_code_folder(prepared["tokenizer"], tmp_path / "tok", marker, "tokenizer")
    remote_code_folder(base_models["root"] / "ref", tmp_path / "model", marker, "model")
    try:
        tok = load_tokenizer(tmp_path / "tok")
        assert tok("hello")["input_ids"]
    except ValueError as exc:  # refusing outright is fine too
        assert "trust_remote_code" in str(exc)
    try:
        model = load_base(tmp_path / "model", allow_pickle=False)
        assert type(model).__name__ == "LlamaForCausalLM"
    except ValueError as exc:
        assert "trust_remote_code" in str(exc)
    assert not marker.exists()


def calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            owner = getattr(f.value, "id", "") if isinstance(f, ast.Attribute) else ""
            yield name, owner, {k.arg: k.value for k in node.keywords if k.arg}, node


def test_every_weight_load_in_src_is_safe():
    problems, loads = [], 0
    for path in sorted((REPO / "src" / "llmpipe").rglob("*.py")):
        rel = path.relative_to(REPO)
        for name, owner, kw, node in calls(ast.parse(path.read_text())):
            where = f"{rel}:{node.lineno}"
            const = {k: v.value for k, v in kw.items() if isinstance(v, ast.Constant)}
            if name == "load" and owner == "torch":
                loads += 1
                if const.get("weights_only") is not True:
                    problems.append(f"{where}: torch.load without weights_only=True")
            if const.get("trust_remote_code") is True:
                problems.append(f"{where}: trust_remote_code=True")
            if const.get("weights_only") is False:
                problems.append(f"{where}: weights_only=False")
            if name in ("load", "loads", "Unpickler") and owner in ("pickle", "cPickle", "dill", "joblib"):
                problems.append(f"{where}: {owner}.{name}")
    assert loads >= 3  # the scan sees the torch checkpoint loads
    assert not problems, "\n".join(problems)
