"""Peak memory of neuron-shard (HF -> NxD rank files) and neuron-merge (rank files -> HF) on a
random-weight ~1.1B-parameter Llama, for each NxD layout the project accepts.

  python benchmarks/neuron_shard_memory.py [--dtype bfloat16|float32] [--layouts fused,gqa,pp,xser]
                                           [--digest] [--keep DIR]

Writes the checkpoint (two safetensors files + index, config.json) to a temporary folder, then per
layout runs `python -m llmpipe neuron-shard` and `neuron-merge` each in a fresh process and reads its
peak RSS (/proc/self/status VmHWM at the end: anonymous and file-backed pages). The xser layout merges
a training step written in NxD's xser format (reference file + one file per tensor, made from the
shards here, not measured). Prints each peak against the bound 2 x the largest tensor + 0.3 GB, the
ratio to the model size, and the peak RSS of a process that only imports what each command imports
(the floor). --digest prints a sha256 of each command's output files (to compare runs byte for byte).
NxD's own converter (checkpoint_converter.py, which loads the whole model) needs ~1.45x forward and
~2x reverse (measured in ../shared/notes/neuron.md, not here: it needs the Neuron packages).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import torch
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parents[1]
GB = 1e9
SLACK = 0.3 * GB  # the bound: 2 x largest tensor + 0.3 GB
NXD_BASELINE = {"neuron-shard": 1.45, "neuron-merge": 2.0}
# name -> (layout, merge from xser); the model has 32 query heads, 8 KV heads
LAYOUTS = {
    "fused": ({"tp": 8, "qkv_linear": True, "kv_size_multiplier": 1}, False),  # weight_qkv, 1 KV head / rank
    "gqa": ({"tp": 32, "qkv_linear": True, "kv_size_multiplier": 4}, False),  # KV replicated 4x (trn1 order)
    "pp": ({"tp": 4, "pp": 4}, False),  # no qkv_linear: separate q/k/v, 2 KV heads / rank, 4 stages
    "xser": ({"tp": 16, "pp": 2, "qkv_linear": True, "kv_size_multiplier": 2, "hw_backend": "trn2"}, True),
}


def model_shapes(layers=16, hidden=2048, heads=32, kv=8, inter=8192, vocab=32000) -> dict[str, tuple]:
    hd = hidden // heads
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}"
        shapes |= {
            f"{p}.input_layernorm.weight": (hidden,),
            f"{p}.post_attention_layernorm.weight": (hidden,),
            f"{p}.self_attn.q_proj.weight": (heads * hd, hidden),
            f"{p}.self_attn.k_proj.weight": (kv * hd, hidden),
            f"{p}.self_attn.v_proj.weight": (kv * hd, hidden),
            f"{p}.self_attn.o_proj.weight": (hidden, heads * hd),
            f"{p}.mlp.gate_proj.weight": (inter, hidden),
            f"{p}.mlp.up_proj.weight": (inter, hidden),
            f"{p}.mlp.down_proj.weight": (hidden, inter),
        }
    return shapes | {"model.norm.weight": (hidden,), "lm_head.weight": (vocab, hidden)}


def write_model(folder: Path, dtype: torch.dtype, **dims) -> tuple[int, int]:
    """Random Llama weights in two safetensors files; returns (bytes of weights, bytes of the largest tensor)."""
    shapes = model_shapes(**dims)
    names = list(shapes)
    files = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    g = torch.Generator().manual_seed(0)
    total = largest = 0
    for f, keys in files.items():
        part = {k: (torch.randn(shapes[k], generator=g) * 0.02).to(dtype) for k in keys}
        sizes = [t.numel() * t.element_size() for t in part.values()]
        total, largest = total + sum(sizes), max(largest, *sizes)
        save_file(part, folder / f)
        del part
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": {k: f for f, ks in files.items() for k in ks}})
    )
    d = {"layers": 16, "hidden": 2048, "heads": 32, "kv": 8, "inter": 8192, "vocab": 32000} | dims
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": d["hidden"],
                "intermediate_size": d["inter"],
                "num_hidden_layers": d["layers"],
                "num_attention_heads": d["heads"],
                "num_key_value_heads": d["kv"],
                "vocab_size": d["vocab"],
                "tie_word_embeddings": False,
                "rms_norm_eps": 1e-5,
                "rope_theta": 500000.0,
                "max_position_embeddings": 8192,
            }
        )
    )
    return total, largest


def write_xser_step(ckpt: Path, step: int) -> None:
    """ckpt/step_<step>/ in NxD's xser format (reference file of torch_xla TensorReference objects,
    .tensors/tensor_<i>.pt, .info.pt) from the pretrained_weight shards, one tensor at a time."""
    mod = types.ModuleType("torch_xla.utils.serialization")

    class TensorReference:  # torch_xla's: a tensor id
        def __init__(self, tid):
            self.tid = tid

    TensorReference.__module__, TensorReference.__qualname__ = mod.__name__, "TensorReference"
    mod.TensorReference = TensorReference
    sys.modules.update({"torch_xla": types.ModuleType("torch_xla"), "torch_xla.utils": types.ModuleType("torch_xla.utils")})
    sys.modules[mod.__name__] = mod
    out = ckpt / f"step_{step}" / "model"
    out.mkdir(parents=True)
    try:
        for src in sorted((ckpt / "pretrained_weight" / "model").iterdir()):
            state = torch.load(src, weights_only=True, mmap=True)
            (out / f"{src.name}.tensors").mkdir()
            ref, info = {}, {}
            for tid, (name, t) in enumerate(state.items()):
                torch.save(t.clone(), out / f"{src.name}.tensors" / f"tensor_{tid}.pt")
                ref[name], info[tid] = TensorReference(tid), {"dtype": t.dtype, "shape": t.shape}
            torch.save(ref, out / src.name)
            torch.save(info, out / f"{src.name}.info.pt")
            del state
    finally:
        for k in ("torch_xla.utils.serialization", "torch_xla.utils", "torch_xla"):
            sys.modules.pop(k, None)
    (ckpt / f"step_{step}" / "checkpoint").write_text("1")
    (ckpt / f"step_{step}" / "done").write_text("1")


# Runs one llmpipe command and prints the process's peak RSS: VmHWM of this process image (after
# exec, so memory the parent held at fork time does not count, as it would in wait4's ru_maxrss).
# With no command: the imports of the command named by --floor only.
CHILD = """
import sys
if sys.argv[1] == "--floor":
    import llmpipe.__main__, llmpipe.backends.neuron.shard, llmpipe.backends.neuron.merge
    if sys.argv[2] == "neuron-merge":  # merge imports these after the tensors are written
        import transformers, llmpipe.model.hf_compat
        from transformers import LlamaConfig
else:
    from llmpipe.__main__ import main
    main(sys.argv[1:])
hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print("PEAK_RSS_KB", int(hwm.split()[1]), flush=True)
"""


def peak_rss(args: list[str]) -> tuple[int, float]:
    """(peak RSS bytes, seconds) of `python -m llmpipe ARGS` in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", CHILD, *args], env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"llmpipe {' '.join(args[:1])} failed:\n{r.stderr[-2000:]}")
    kb = next(int(line.split()[1]) for line in r.stdout.splitlines() if line.startswith("PEAK_RSS_KB"))
    return kb * 1024, time.perf_counter() - start


def digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(p.name.encode())
        with open(p, "rb") as fh:
            while block := fh.read(1 << 24):
                h.update(block)
    return h.hexdigest()[:16]


def report(cmd: str, rss: int, secs: float, size: int, largest: int, floor: int, extra: str = "") -> bool:
    bound = 2 * largest + SLACK
    ok = rss <= bound
    print(
        f"  {cmd:12s} {secs:6.1f} s  peak RSS {rss / GB:.3f} GB = {rss / size:.3f} x model; "
        f"bound 2 x {largest / GB:.3f} + 0.3 = {bound / GB:.3f} GB: {'holds' if ok else 'EXCEEDED'} "
        f"(imports alone {floor / GB:.3f} GB; NxD's converter ~{NXD_BASELINE[cmd]} x){extra}"
    )
    return ok


def run_layout(root: Path, name: str, size: int, largest: int, floors: dict, want_digest: bool) -> list[bool]:
    layout, xser = LAYOUTS[name]
    ckpt, out = root / f"nxd-{name}", root / f"hf-{name}"
    rss, secs = peak_rss(["neuron-shard", "--model", str(root / "hf"), "--out", str(ckpt), "--layout", json.dumps(layout)])
    files = sorted((ckpt / "pretrained_weight" / "model").iterdir())
    extra = f"; {len(files)} rank files" + (f", sha256 {digest(files)}" if want_digest else "")
    print(f"{name}: {layout}{' (merged from an xser step)' if xser else ''}")
    oks = [report("neuron-shard", rss, secs, size, largest, floors["neuron-shard"], extra)]
    if xser:
        write_xser_step(ckpt, 1)
    rss, secs = peak_rss(
        ["neuron-merge", "--checkpoint-dir", str(ckpt), "--out", str(out), "--step", "latest" if xser else "pretrained"]
    )
    extra = f", sha256 {digest(list(out.glob('*.safetensors')))}" if want_digest else ""
    oks.append(report("neuron-merge", rss, secs, size, largest, floors["neuron-merge"], extra))
    shutil.rmtree(ckpt), shutil.rmtree(out)
    return oks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, of {', '.join(LAYOUTS)}")
    p.add_argument("--digest", action="store_true", help="print a sha256 of each command's output files")
    p.add_argument("--keep", help="write the checkpoint here instead of a temporary folder (kept)")
    args = p.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="neuron-shard-bench-"))
    (root / "hf").mkdir(parents=True, exist_ok=True)
    size, largest = write_model(root / "hf", getattr(torch, args.dtype))
    params = size // (2 if args.dtype == "bfloat16" else 4)
    floors = {cmd: peak_rss(["--floor", cmd])[0] for cmd in ("neuron-shard", "neuron-merge")}
    print(
        f"model: {params / 1e9:.2f} B parameters, {args.dtype}, {size / GB:.2f} GB; largest tensor {largest / GB:.3f} GB; "
        f"bound 2 x largest + 0.3 GB = {(2 * largest + SLACK) / GB:.3f} GB ({(2 * largest + SLACK) / size:.3f} x model)"
    )
    oks = []
    for name in args.layouts.split(","):
        oks += run_layout(root, name, size, largest, floors, args.digest)
    print(f"bound holds for {sum(oks)} of {len(oks)} runs")
    if not args.keep:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
