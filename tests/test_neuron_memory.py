"""neuron-shard and neuron-merge in bounded memory: peak RSS (VmHWM, each command in a fresh process, as
benchmarks/neuron_shard_memory.py measures it) at most 2 x the largest tensor + what the imports alone
take + a small margin, on a ~0.4 GB model whose largest tensor is 4 % of it, so holding a rank file,
a pipeline stage's memory maps or the model would show. Layouts: pp > 1 without qkv_linear, and GQA
replication (kv_size_multiplier 2, fused QKV) from torch.save rank files and from an xser step.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from safetensors import safe_open

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("neuron_shard_memory", REPO / "benchmarks" / "neuron_shard_memory.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

DIMS = {"layers": 12, "hidden": 1024, "heads": 16, "kv": 4, "inter": 4096, "vocab": 8192}
MARGIN = 48 << 20  # read blocks (16 MB), allocator slack, page tables
GQA = {"tp": 8, "qkv_linear": True, "kv_size_multiplier": 2}  # KV heads replicated, fused QKV
LAYOUTS = [({"tp": 2, "pp": 2}, False), (GQA, False), (GQA, True)]  # pp: separate q/k/v, 2 KV heads per rank


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    import torch

    root = tmp_path_factory.mktemp("mem")
    (root / "hf").mkdir()
    size, largest = bench.write_model(root / "hf", torch.bfloat16, **DIMS)
    floors = {cmd: bench.peak_rss(["--floor", cmd])[0] for cmd in ("neuron-shard", "neuron-merge")}
    return root, size, largest, floors


@pytest.mark.parametrize("layout,xser", LAYOUTS, ids=["pp2-separate", "gqa-kvm2", "gqa-kvm2-xser"])
def test_shard_and_merge_peak_rss_is_bounded_by_the_largest_tensor(model, layout, xser):
    root, size, largest, floors = model
    assert 350e6 < size < 450e6 and largest < 0.05 * size
    tag = f"tp{layout['tp']}{'-xser' if xser else ''}"
    ckpt, out = root / f"nxd-{tag}", root / f"out-{tag}"
    shard_rss, _ = bench.peak_rss(
        ["neuron-shard", "--model", str(root / "hf"), "--out", str(ckpt), "--layout", json.dumps(layout)]
    )
    if xser:
        bench.write_xser_step(ckpt, 1)
    step = "latest" if xser else "pretrained"
    merge_rss, _ = bench.peak_rss(["neuron-merge", "--checkpoint-dir", str(ckpt), "--out", str(out), "--step", step])
    with safe_open(out / "model.safetensors", "pt") as f, safe_open(root / "hf/model-00001-of-00002.safetensors", "pt") as src:
        for name in list(src.keys())[:20]:
            assert f.get_tensor(name).equal(src.get_tensor(name)), name
    mb, over = 1 << 20, []
    for cmd, rss in (("neuron-shard", shard_rss), ("neuron-merge", merge_rss)):
        if rss > 2 * largest + floors[cmd] + MARGIN:
            over.append(
                f"{cmd}: peak RSS {rss / mb:.0f} MB > 2 x largest tensor {largest / mb:.0f} MB "
                f"+ imports {floors[cmd] / mb:.0f} MB + {MARGIN / mb:.0f} MB (model {size / mb:.0f} MB)"
            )
    assert not over, "; ".join(over)


def test_streamed_rank_file_is_byte_for_byte_torch_save(tmp_path):
    """torchfile.save (placeholders filled just before their record) writes exactly torch.save's file,
    and torchfile.read gives back whole tensors, row ranges and strided views."""
    import torch

    from llmpipe.backends.neuron import torchfile

    g = torch.Generator().manual_seed(0)
    state = {
        "w": torch.randn(300, 40, generator=g),
        "b": torch.randn(7, generator=g).to(torch.bfloat16),
        "empty": torch.empty(0, 3),
        "big": torch.randn(700, 1000, generator=g).half(),  # over the 1 MiB mmap threshold
        "i": torch.arange(10),
    }
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    torch.save(state, tmp_path / "a/rank.pt")
    torchfile.save(
        tmp_path / "b/rank.pt", [(k, tuple(t.shape), t.dtype, lambda out, t=t: out.copy_(t)) for k, t in state.items()]
    )
    assert (tmp_path / "a/rank.pt").read_bytes() == (tmp_path / "b/rank.pt").read_bytes()
    meta = torchfile.load(tmp_path / "b/rank.pt")
    assert all(t.device.type == "meta" for t in meta.values())
    for k, t in state.items():
        assert torchfile.read(tmp_path / "b/rank.pt", meta[k]).equal(t), k
    assert torchfile.read(tmp_path / "b/rank.pt", meta["big"], 5, 9).equal(state["big"][5:9])
    torch.save({"view": torch.arange(40.0).view(5, 8)[:, 2:5], "t": torch.arange(12.0).view(3, 4).t()}, tmp_path / "v.pt")
    views = torchfile.load(tmp_path / "v.pt")
    assert torchfile.read(tmp_path / "v.pt", views["view"]).equal(torch.arange(40.0).view(5, 8)[:, 2:5])
    assert torchfile.read(tmp_path / "v.pt", views["t"], 1, 3).equal(torch.arange(12.0).view(3, 4).t()[1:3])


def test_shard_rank_files_equal_torch_save_of_their_tensors(tmp_path):
    """neuron-shard's files are what torch.save writes for the same dict (as before streaming)."""
    import torch

    from llmpipe.backends.neuron.layout import Layout
    from llmpipe.backends.neuron.shard import shard
    from tests.test_neuron_shard import tiny_llama

    tiny_llama(tmp_path, 8, 2, False, dtype=torch.bfloat16)
    shard(tmp_path / "hf", tmp_path / "nxd", Layout(tp=4, pp=2, kv_size_multiplier=2, qkv_linear=True))
    (tmp_path / "again").mkdir()
    for f in sorted((tmp_path / "nxd/pretrained_weight/model").iterdir()):
        torch.save(torch.load(f, weights_only=True), tmp_path / "again" / f.name)
        assert f.read_bytes() == (tmp_path / "again" / f.name).read_bytes(), f.name
