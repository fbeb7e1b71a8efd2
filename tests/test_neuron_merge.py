"""Neuron backend, convert back: NxD training checkpoints (xser and plain torch.save) -> HF.

Fake, and why: NxD writes xser checkpoints through torch_xla, which cannot be installed here; the
test writes the same files (reference file of `torch_xla.utils.serialization.TensorReference(tid)`
objects, `.tensors/tensor_<tid>.pt`, `.info.pt`) with a stand-in class registered under that module
name, then removes it, so the reader runs exactly as it would on a real checkpoint without torch_xla.
"""

from __future__ import annotations

import json
import shutil
import sys
import types

import pytest
import torch
from safetensors.torch import load_file

from llmpipe.backends.neuron.layout import Layout
from llmpipe.backends.neuron.merge import complete_steps, merge
from llmpipe.backends.neuron.shard import shard
from tests.test_neuron_shard import rank_state, tiny_llama


def write_xser(src: dict, path, nested: bool = False):
    """Save `src` as NxD's xser does (with torch_xla's TensorReference class name)."""
    mod = types.ModuleType("torch_xla.utils.serialization")

    class TensorReference:  # torch_xla's: a tensor id
        def __init__(self, tid):
            self.tid = tid

    TensorReference.__module__, TensorReference.__qualname__ = "torch_xla.utils.serialization", "TensorReference"
    mod.TensorReference = TensorReference
    saved = {k: sys.modules.get(k) for k in ("torch_xla", "torch_xla.utils", "torch_xla.utils.serialization")}
    sys.modules.update(
        {
            "torch_xla": types.ModuleType("torch_xla"),
            "torch_xla.utils": types.ModuleType("torch_xla.utils"),
            "torch_xla.utils.serialization": mod,
        }
    )
    try:
        tensors = path.parent / f"{path.name}.tensors"
        tensors.mkdir(parents=True)
        ref, info = {}, {}
        for tid, (name, t) in enumerate(src.items()):
            torch.save(t.clone(), tensors / f"tensor_{tid}.pt")
            ref[name], info[tid] = TensorReference(tid), {"dtype": t.dtype, "shape": t.shape}
        torch.save({"model": ref} if nested else ref, path)
        torch.save(info, path.parent / f"{path.name}.info.pt")
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    assert "torch_xla" not in sys.modules


def make_step(ckpt, step, shards_from, tp, pp, xser, done=True, nested=False, old_names=False):
    """A training step folder as NxD writes it, from the rank files of `shards_from`; old_names: the older
    API's tp_rank_XX_pp_rank_YY (xser reference file) / tp_rank_XX_pp_rank_YY/checkpoint.pt (torch.save)."""
    model_dir = ckpt / f"step_{step}" / "model"
    model_dir.mkdir(parents=True)
    for t in range(tp):
        for p in range(pp):
            state = rank_state(shards_from, t, p)
            f = model_dir / f"dp_rank_00_tp_rank_{t:02d}_pp_rank_{p:02d}.pt"
            if old_names:
                f = model_dir / f"tp_rank_{t:02d}_pp_rank_{p:02d}"
                f = f if xser else f / "checkpoint.pt"
                f.parent.mkdir(parents=True, exist_ok=True)
            if xser:
                write_xser(state, f, nested)
            else:
                torch.save({"model": state} if nested else state, f)
    (ckpt / f"step_{step}" / "checkpoint").write_text("1")
    if done:
        (ckpt / f"step_{step}" / "done").write_text("1")


def test_latest_complete_xser_step_is_merged(tmp_path):
    layout = Layout(tp=4, pp=2, kv_size_multiplier=2, qkv_linear=True)
    m0 = tiny_llama(tmp_path / "m0", 8, 2, False, seed=0)
    m1 = tiny_llama(tmp_path / "m1", 8, 2, False, seed=1)
    tiny_llama(tmp_path / "m2", 8, 2, False, seed=2)
    ckpt = tmp_path / "nxd"
    for name in ("m0", "m1", "m2"):
        shard(tmp_path / name / "hf", tmp_path / f"s-{name}", layout)
    shutil.copytree(tmp_path / "s-m0/pretrained_weight", ckpt / "pretrained_weight")
    make_step(ckpt, 4, tmp_path / "s-m0", 4, 2, xser=False)
    make_step(ckpt, 8, tmp_path / "s-m1", 4, 2, xser=True, nested=True)
    make_step(ckpt, 12, tmp_path / "s-m2", 4, 2, xser=True, done=False)  # interrupted save: no `done`
    assert complete_steps(ckpt) == [4, 8]
    summary = merge(ckpt, tmp_path / "out", step="latest", dtype="float32")
    assert summary["tag"] == "step_8"
    got = load_file(tmp_path / "out/model.safetensors")
    for name, t in m1.state_dict().items():
        assert torch.equal(got[name], t), name
    merge(ckpt, tmp_path / "out4", step="4", dtype="float32")
    got4 = load_file(tmp_path / "out4/model.safetensors")
    assert all(torch.equal(got4[n], t) for n, t in m0.state_dict().items())
    with pytest.raises(FileNotFoundError, match=r"step '12' is not a complete checkpoint; complete: \[4, 8\]"):
        merge(ckpt, tmp_path / "out12", step="12")


@pytest.mark.parametrize("xser", [True, False], ids=["xser", "torch.save"])
def test_older_rank_file_names_merge_exactly(tmp_path, xser):
    """NxD's older checkpoint API: tp_rank_XX_pp_rank_YY (xser) or tp_rank_XX_pp_rank_YY/checkpoint.pt."""
    layout = Layout(tp=4, pp=2, kv_size_multiplier=2, qkv_linear=True)
    m = tiny_llama(tmp_path / "m", 8, 2, False, seed=3)
    shard(tmp_path / "m" / "hf", tmp_path / "s", layout)
    ckpt = tmp_path / "nxd"
    shutil.copytree(tmp_path / "s/pretrained_weight", ckpt / "pretrained_weight")
    make_step(ckpt, 6, tmp_path / "s", 4, 2, xser=xser, old_names=True)
    names = sorted(x.name for x in (ckpt / "step_6/model").iterdir())
    assert "dp_rank_00_tp_rank_00_pp_rank_00.pt" not in names and "tp_rank_00_pp_rank_00" in names
    merge(ckpt, tmp_path / "out", step="latest", dtype="float32")
    got = load_file(tmp_path / "out/model.safetensors")
    for name, t in m.state_dict().items():
        assert torch.equal(got[name], t), name
    # a missing rank is named with every name it was looked for under
    victim = ckpt / "step_6/model" / ("tp_rank_03_pp_rank_01" if xser else "tp_rank_03_pp_rank_01/checkpoint.pt")
    victim.unlink()
    with pytest.raises(FileNotFoundError, match="has none of tp_rank_03_pp_rank_01, tp_rank_03_pp_rank_01/checkpoint.pt"):
        merge(ckpt, tmp_path / "out2", step="latest", dtype="float32")


def test_fused_qkv_split_by_head_counts_not_thirds(tmp_path):
    """Llama-3-70B-like: 4 query heads but 1 KV head per rank (heads 32, kv 4, tp 8, kvm 2). NxD's
    reverse conversion cuts weight_qkv in equal thirds; here that gives q 2 heads, not 4."""
    model = tiny_llama(tmp_path, 32, 4, False)
    shard(tmp_path / "hf", tmp_path / "nxd", Layout(tp=8, pp=1, kv_size_multiplier=2, qkv_linear=True))
    hd = model.config.hidden_size // 32
    fused = rank_state(tmp_path / "nxd", 0, 0)["model.layers.0.self_attn.qkv_proj.weight_qkv"]
    assert fused.shape[0] == (4 + 1 + 1) * hd
    thirds_q = torch.split(fused, fused.shape[0] // 3, 0)[0]
    rank0_q = model.state_dict()["model.layers.0.self_attn.q_proj.weight"][: 4 * hd]  # rank 0 holds query group 0
    assert thirds_q.shape != rank0_q.shape  # the equal-thirds split takes the wrong rows
    merge(tmp_path / "nxd", tmp_path / "out", step="pretrained", dtype="float32")
    got = load_file(tmp_path / "out/model.safetensors")
    assert all(torch.equal(got[n], t) for n, t in model.state_dict().items())


def test_tied_model_stays_tied_until_training_unties_it(tmp_path):
    model = tiny_llama(tmp_path, 8, 2, True)
    layout = Layout(tp=2, pp=2)
    shard(tmp_path / "hf", tmp_path / "nxd", layout)
    merge(tmp_path / "nxd", tmp_path / "same", step="pretrained", dtype="float32")
    assert "lm_head.weight" not in load_file(tmp_path / "same/model.safetensors")
    # "training" moved lm_head away from the embeddings (NxD trains its own lm_head)
    trained = tmp_path / "trained"
    (trained / "pretrained_weight").mkdir(parents=True)
    for t in range(2):
        state = rank_state(tmp_path / "nxd", t, 1)
        state["lm_head.weight"] = state["lm_head.weight"] + 1
        (trained / "model").mkdir(exist_ok=True)
        torch.save(state, trained / "model" / f"dp_rank_00_tp_rank_{t:02d}_pp_rank_01.pt")
    make_step(tmp_path / "nxd", 2, tmp_path / "nxd", 2, 2, xser=False)
    for t in range(2):
        shutil.copy(
            trained / "model" / f"dp_rank_00_tp_rank_{t:02d}_pp_rank_01.pt",
            tmp_path / "nxd/step_2/model" / f"dp_rank_00_tp_rank_{t:02d}_pp_rank_01.pt",
        )
    summary = merge(tmp_path / "nxd", tmp_path / "untied", dtype="float32")
    got = load_file(tmp_path / "untied/model.safetensors")
    assert summary["tie_word_embeddings"] is False
    assert torch.equal(got["lm_head.weight"], model.lm_head.weight + 1)
    assert torch.equal(got["model.embed_tokens.weight"], model.model.embed_tokens.weight)


def test_layout_mismatch_is_refused(tmp_path):
    tiny_llama(tmp_path, 8, 2, False)
    shard(tmp_path / "hf", tmp_path / "nxd", Layout(tp=4, pp=1, kv_size_multiplier=2, qkv_linear=True))
    with pytest.raises(ValueError, match="rank files beyond the layout"):
        merge(tmp_path / "nxd", tmp_path / "o1", step="pretrained", layout=Layout(tp=2, pp=1, qkv_linear=True))
    with pytest.raises(
        ValueError, match=r"does not match layout qkv_linear .*unexpected \['model.layers.0.self_attn.qkv_proj.weight_qkv'"
    ):
        merge(
            tmp_path / "nxd",
            tmp_path / "o2",
            step="pretrained",
            layout=Layout(tp=4, pp=1, kv_size_multiplier=2, qkv_linear=True, fuse_qkv=False),
        )
    with pytest.raises(FileNotFoundError, match="no complete step_<N>"):
        merge(tmp_path / "nxd", tmp_path / "o3")


def test_rank_files_beyond_the_layout_anywhere_and_unreadable_ones_are_named(tmp_path):
    tiny_llama(tmp_path, 8, 2, False)
    layout = Layout(tp=2, pp=2, qkv_linear=True)
    shard(tmp_path / "hf", tmp_path / "nxd", layout)
    model = tmp_path / "nxd/pretrained_weight/model"
    for extra in ("dp_rank_00_tp_rank_02_pp_rank_01.pt", "tp_rank_01_pp_rank_02/checkpoint.pt"):  # not on pp 0 / tp 0
        (model / extra).parent.mkdir(exist_ok=True)
        shutil.copy(model / "dp_rank_00_tp_rank_00_pp_rank_00.pt", model / extra)
        with pytest.raises(ValueError, match=rf"rank files beyond the layout \({extra}\)"):
            merge(tmp_path / "nxd", tmp_path / "out", step="pretrained")
        (model / extra).unlink()
    cut = model / "dp_rank_00_tp_rank_01_pp_rank_01.pt"
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    with pytest.raises(ValueError, match=rf"NxD rank file {cut} cannot be read"):
        merge(tmp_path / "nxd", tmp_path / "out", step="pretrained")
    (tmp_path / "nxd/pretrained_weight/nxd_layout.json").unlink()
    cfg = json.loads((tmp_path / "hf/config.json").read_text())
    with pytest.raises(FileNotFoundError, match=r"nxd_layout.json is missing: give the layout .*\(--layout\)"):
        merge(tmp_path / "nxd", tmp_path / "out", step="pretrained", hf_config=cfg)
    assert not (tmp_path / "out").exists()


def test_cli_shard_then_merge_with_sharded_output_and_tokenizer(tmp_path):
    """neuron-merge's CLI, with the output split over several safetensors files (+ index)."""
    import subprocess

    from tests.conftest import GPT2, REPO

    model = tiny_llama(tmp_path, 8, 2, False)
    env = {"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"}
    shard(tmp_path / "hf", tmp_path / "nxd", Layout(tp=2, pp=2, qkv_linear=True))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmpipe",
            "neuron-merge",
            "--checkpoint-dir",
            str(tmp_path / "nxd"),
            "--step",
            "pretrained",
            "--out",
            str(tmp_path / "out"),
            "--tokenizer",
            str(GPT2),
            "--dtype",
            "float32",
            "--max-shard-gb",
            "0.00001",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    index = json.loads((tmp_path / "out/model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    got = {}
    for f in files:
        got.update(load_file(tmp_path / "out" / f))
    assert all(torch.equal(got[n], t) for n, t in model.state_dict().items())
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in got.values())  # tensor bytes, as HF's index counts
    assert (tmp_path / "out/tokenizer.json").is_file() and (tmp_path / "out/config.json").is_file()
