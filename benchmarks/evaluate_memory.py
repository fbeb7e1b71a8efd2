"""Peak memory and time of `llmpipe evaluate` with the model held whole and with its weights streamed module
by module (eval.stream_weights), on a random-weight ~1.1B-parameter Llama (TinyLlama's shape) saved in bf16.

  python benchmarks/evaluate_memory.py [--layers 22] [--rows 2] [--seq 512] [--keep DIR]

Writes config.json and the weights (two safetensors files and their index) and an hf view of
`rows` random rows (val split, no tokenizer record), then runs evaluate in a fresh process per mode, one
row a batch, and reads how far its RSS grew over what it held once it had imported what evaluate imports
and read the view (/proc/self/clear_refs, then VmHWM). Prints each growth against the model in float32 and
its largest tensor, the ratio streamed / whole, the times, and whether the two losses are equal (they must
be: the same forward pass).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from neuron_shard_memory import write_model as write_llama  # benchmarks/neuron_shard_memory.py

REPO = Path(__file__).resolve().parents[1]
GB = 1e9

CHILD = """
import json, sys, time
import datasets, torch, transformers, llmpipe.evaluate
datasets.load_from_disk(sys.argv[2] + "/val")
transformers.AutoConfig.from_pretrained(sys.argv[1])


def status(key):  # kB
    return int(next(line for line in open("/proc/self/status") if line.startswith(key)).split()[1])


open("/proc/self/clear_refs", "w").write("5")  # resets the peak (VmHWM) to the RSS now
base, began = status("VmRSS"), time.perf_counter()
llmpipe.evaluate.evaluate(sys.argv[1], sys.argv[2], sys.argv[3], 1, 2, stream_weights=sys.argv[4] == "streamed")
print(json.dumps({"base_kb": base, "peak_kb": status("VmHWM"), "wall_s": time.perf_counter() - began}))
"""


def write_model(folder: Path, layers: int) -> tuple[int, int]:
    """TinyLlama's shape in random bf16 weights (neuron_shard_memory's writer): (parameters, largest tensor in
    float32 bytes)."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    total, largest = write_llama(folder, torch.bfloat16, layers=layers, kv=4, inter=5632)
    return total // 2, largest * 2


def write_view(folder: Path, rows: int, seq: int, vocab=32000) -> None:
    import datasets
    import numpy as np

    ids = np.random.default_rng(0).integers(0, vocab, (rows, seq), dtype=np.int64)
    cols = {"input_ids": ids.tolist(), "labels": ids.tolist(), "attention_mask": np.ones_like(ids, dtype=np.int8).tolist()}
    datasets.Dataset.from_dict(cols).save_to_disk(str(folder / "val"))
    (folder / "view.json").write_text("{}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=22, help="decoder layers (22: ~1.1 B parameters)")
    p.add_argument("--rows", type=int, default=2)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--keep", help="write the model and view here and keep them (default: a temporary folder)")
    args = p.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="evaluate-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        params, largest = write_model(work / "model", args.layers)
        write_view(work / "view", args.rows, args.seq)
        env = {"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin", "TOKENIZERS_PARALLELISM": "false"}
        got = {}
        for mode in ("whole", "streamed"):
            out = work / f"{mode}.json"
            cmd = [sys.executable, "-c", CHILD, str(work / "model"), str(work / "view"), str(out), mode]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(f"evaluate ({mode}) failed:\n{proc.stderr[-3000:]}")
            m = json.loads(proc.stdout.strip().splitlines()[-1])
            got[mode] = {"grew": (m["peak_kb"] - m["base_kb"]) * 1024, "base": m["base_kb"] * 1024, "wall_s": m["wall_s"]}
            got[mode]["eval"] = json.loads(out.read_text())
        print(
            f"model: {params / 1e9:.2f} B parameters, {4 * params / GB:.2f} GB in float32, largest tensor {largest / GB:.3f} GB"
        )
        print(f"imports + the view (each process, before evaluate): {got['whole']['base'] / GB:.2f} GB")
        for mode in ("whole", "streamed"):
            g = got[mode]
            print(
                f"{mode:9s} grew {g['grew'] / GB:.2f} GB ({g['grew'] / (4 * params):.2f}x the float32 model, "
                f"{g['grew'] / largest:.1f}x its largest tensor), {g['wall_s']:.1f} s, val_loss {g['eval']['val_loss']:.6f}"
            )
        ratio = got["streamed"]["grew"] / got["whole"]["grew"]
        same = got["streamed"]["eval"]["val_loss"] == got["whole"]["eval"]["val_loss"]
        print(f"streamed / whole: {ratio:.3f}; losses equal: {same}")
        if not same:
            raise SystemExit("the streamed loss differs from the whole model's")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
