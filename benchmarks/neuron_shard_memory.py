"""Peak memory of neuron-shard (HF -> NxD rank files) on a random-weight ~1B-parameter Llama.

  python benchmarks/neuron_shard_memory.py [--dtype bfloat16|float32] [--tp 8] [--pp 1] [--keep DIR]

Writes the checkpoint (two safetensors files + index, config.json) to a temporary folder, runs
`python -m llmpipe neuron-shard` in a fresh process and reads its peak RSS (/proc/self/status VmHWM
at the end), plus the peak RSS of a process that only imports what neuron-shard imports (the floor).
Prints peak RSS / model size against the 0.3 target; NxD's own converter (checkpoint_converter.py,
which loads the whole model) needs ~1.45x (measured in ../shared/notes/neuron.md, not here: it needs
the Neuron packages).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parents[1]
TARGET, NXD_BASELINE = 0.3, 1.45


def write_model(folder: Path, dtype: torch.dtype, layers=16, hidden=2048, heads=32, kv=8, inter=8192, vocab=32000) -> int:
    """Random Llama weights in two safetensors files; returns the bytes of weights."""
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
    shapes |= {"model.norm.weight": (hidden,), "lm_head.weight": (vocab, hidden)}
    names = list(shapes)
    files = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    g = torch.Generator().manual_seed(0)
    total = 0
    for f, keys in files.items():
        part = {k: (torch.randn(shapes[k], generator=g) * 0.02).to(dtype) for k in keys}
        total += sum(t.numel() * t.element_size() for t in part.values())
        save_file(part, folder / f)
        del part
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": {k: f for f, ks in files.items() for k in ks}})
    )
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": hidden,
                "intermediate_size": inter,
                "num_hidden_layers": layers,
                "num_attention_heads": heads,
                "num_key_value_heads": kv,
                "vocab_size": vocab,
                "tie_word_embeddings": False,
                "rms_norm_eps": 1e-5,
                "rope_theta": 500000.0,
                "max_position_embeddings": 8192,
            }
        )
    )
    return total


# Runs one llmpipe command and prints the process's peak RSS: VmHWM of this process image (after
# exec, so memory the parent held at fork time does not count, as it would in wait4's ru_maxrss).
CHILD = """
import sys
from llmpipe.__main__ import main
if sys.argv[1:]:
    main(sys.argv[1:])
else:
    import llmpipe.backends.neuron.shard  # the imports alone
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--keep", help="write the checkpoint and shards here instead of a temporary folder")
    args = p.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="neuron-shard-bench-"))
    (root / "hf").mkdir(parents=True, exist_ok=True)
    size = write_model(root / "hf", getattr(torch, args.dtype))
    params = size // (2 if args.dtype == "bfloat16" else 4)
    layout = {"tp": args.tp, "pp": args.pp, "qkv_linear": args.tp % 8 == 0, "kv_size_multiplier": max(1, args.tp // 8)}
    floor, _ = peak_rss([])
    rss, secs = peak_rss(
        ["neuron-shard", "--model", str(root / "hf"), "--out", str(root / "nxd"), "--layout", json.dumps(layout)]
    )
    out = sum(f.stat().st_size for f in (root / "nxd/pretrained_weight/model").iterdir())
    gib = 1 << 30
    print(f"model: {params / 1e9:.2f} B parameters, {args.dtype}, {size / gib:.2f} GiB; layout {layout}, pp {args.pp}")
    print(f"neuron-shard: {secs:.1f} s, {args.tp * args.pp} rank files, {out / gib:.2f} GiB written")
    print(
        f"peak RSS {rss / gib:.3f} GiB = {rss / size:.3f} x model size (target <= {TARGET}: "
        f"{'met' if rss / size <= TARGET else 'NOT met'}; ratio to target {rss / size / TARGET:.2f})"
    )
    print(f"  of which the interpreter + imports alone: {floor / gib:.3f} GiB ({floor / size:.3f} x)")
    print(
        f"NxD's checkpoint_converter.py (baseline, from ../shared/notes/neuron.md): ~{NXD_BASELINE} x model size "
        f"-> ~{NXD_BASELINE * size / gib:.2f} GiB here; ours is {NXD_BASELINE * size / rss:.1f}x less"
    )
    if not args.keep:
        import shutil

        shutil.rmtree(root)


if __name__ == "__main__":
    main()
