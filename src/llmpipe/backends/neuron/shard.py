"""neuron-shard: an HF Llama checkpoint -> NxD's pretrained_weight rank files.

  python -m llmpipe neuron-shard --model results/default/checkpoints/init --out CKPT_DIR \\
      --layout '{"tp": 32, "pp": 8, "kv_size_multiplier": 4, "qkv_linear": true}'

writes CKPT_DIR/pretrained_weight/model/dp_rank_00_tp_rank_XX_pp_rank_YY.pt (torch.save of a flat
dict, HF-style global names) as NxD's loader reads them with
`run_llama_nxd.py --pretrained_weight 1 --checkpoint_dir CKPT_DIR`, and pretrained_weight/nxd_layout.json
(the layout and the HF config, which neuron-merge reads back).
Streaming: each rank file is written tensor by tensor (torchfile.save: torch.save's own format), each
tensor read slice by slice (hf_reader) just before its bytes are written and freed after, so peak
memory is about one tensor, not a rank file or the model (NxD's own converter loads the whole model: ~1.45x).
Tied embeddings: lm_head is written from embed_tokens (NxD's Llama has its own lm_head).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import torch

from llmpipe.backends.neuron import torchfile
from llmpipe.backends.neuron.hf_reader import HFCheckpoint
from llmpipe.backends.neuron.layout import Dims, Layout, kv_rows, layer_pp_rank, q_rows, rank_file, split
from llmpipe.io import atomic_path, write_json
from llmpipe.model.safetensors_out import map_large_allocations, release_freed_memory

log = logging.getLogger(__name__)

LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
LAYER_KEYS = {
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
}
TOP_KEYS = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
LAYOUT_FILE = "nxd_layout.json"
IGNORED = ("rotary_emb.inv_freq",)  # buffers some old checkpoints carry; NxD recomputes them


def check_keys(names: list[str], d: Dims) -> None:
    """Every tensor must be one NxD's Llama has (a clear error before any work)."""
    expected = {"model.embed_tokens.weight", "model.norm.weight"} | {
        f"model.layers.{i}.{k}" for i in range(d.layers) for k in LAYER_KEYS
    }
    present = {n for n in names if not n.endswith(IGNORED)}
    missing = sorted(expected - present)
    unknown = sorted(present - expected - {"lm_head.weight"})
    if "lm_head.weight" not in present and not d.tied:
        missing.append("lm_head.weight (tie_word_embeddings is false)")
    if missing or unknown:
        raise ValueError(
            "checkpoint does not match NxD's Llama: "
            + (f"missing {missing[:8]}{' ...' if len(missing) > 8 else ''}; " if missing else "")
            + (f"unexpected {unknown[:8]}{' ...' if len(unknown) > 8 else ''}" if unknown else "")
        )


def stacked(hf: HFCheckpoint, names: list[str], ranges: list[tuple[int, int]], out: torch.Tensor) -> torch.Tensor:
    """Row ranges of several tensors one after another in `out` (read straight into place)."""
    at = 0
    for name, (a, b) in zip(names, ranges):
        hf.rows(name, a, b, out[at : at + b - a])
        at += b - a
    return out


def rows_of(hf: HFCheckpoint, out_name: str, name: str, a: int, b: int) -> torchfile.Entry:
    return out_name, (b - a, *hf.shape(name)[1:]), hf.dtype(name), lambda out: hf.rows(name, a, b, out)


def cols_of(hf: HFCheckpoint, name: str, a: int, b: int) -> torchfile.Entry:
    return name, (hf.shape(name)[0], b - a), hf.dtype(name), lambda out: hf.cols(name, a, b, out)


def full(hf: HFCheckpoint, name: str) -> torchfile.Entry:
    return rows_of(hf, name, name, 0, hf.shape(name)[0])


def stacked_of(hf: HFCheckpoint, out_name: str, names: list[str], ranges: list[tuple[int, int]]) -> torchfile.Entry:
    shape = (sum(b - a for a, b in ranges), *hf.shape(names[0])[1:])
    return out_name, shape, hf.dtype(names[0]), lambda out: stacked(hf, names, ranges, out)


def attention_entries(hf: HFCheckpoint, prefix: str, tp_rank: int, layout: Layout, d: Dims) -> list[torchfile.Entry]:
    a = f"{prefix}.self_attn"
    names = [f"{a}.{x}_proj.weight" for x in "qkv"]
    ranges = [q_rows(tp_rank, layout, d), kv_rows(tp_rank, layout, d), kv_rows(tp_rank, layout, d)]
    style = layout.attention
    if style in ("qkv_linear_fused", "coalesced"):  # per rank [q_r; k_r; v_r], read straight into place
        out = [stacked_of(hf, f"{a}.qkv_proj.weight_qkv" if layout.qkv_linear else f"{a}.qkv_proj.weight", names, ranges)]
    else:
        new = [f"{a}.qkv_proj.weight_{x}" for x in "qkv"] if style == "qkv_linear" else names
        out = [rows_of(hf, n, src, *r) for n, src, r in zip(new, names, ranges)]
    return out + [cols_of(hf, f"{a}.o_proj.weight", *q_rows(tp_rank, layout, d))]


def rank_entries(hf: HFCheckpoint, tp_rank: int, pp_rank: int, layout: Layout, d: Dims) -> Iterator[torchfile.Entry]:
    """(name, shape, dtype, fill) of one rank file's tensors, in model order."""
    tp, last = layout.tp, layout.pp - 1
    if pp_rank == 0:
        yield rows_of(hf, "model.embed_tokens.weight", "model.embed_tokens.weight", *split(d.vocab, tp_rank, tp))
    owners = layer_pp_rank(d.layers, layout.pp, layout.vpp)
    for i in range(d.layers):
        if owners[i] != pp_rank:
            continue
        p = f"model.layers.{i}"
        yield full(hf, f"{p}.input_layernorm.weight")
        yield from attention_entries(hf, p, tp_rank, layout, d)
        yield full(hf, f"{p}.post_attention_layernorm.weight")
        rows = split(d.intermediate, tp_rank, tp)
        yield stacked_of(
            hf, f"{p}.mlp.gate_up_proj.weight", [f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight"], [rows, rows]
        )
        yield cols_of(hf, f"{p}.mlp.down_proj.weight", *rows)
    if pp_rank == last:
        yield full(hf, "model.norm.weight")
        head = "lm_head.weight" if "lm_head.weight" in hf else "model.embed_tokens.weight"
        yield rows_of(hf, "lm_head.weight", head, *split(d.vocab, tp_rank, tp))


def shard(model_dir: str | Path, out_dir: str | Path, layout: Layout) -> dict:
    """Write out_dir/pretrained_weight/{model/*.pt, nxd_layout.json}; returns the layout record."""
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    d = Dims.from_hf_config(cfg)
    layout = layout.check(d)
    hf = HFCheckpoint(model_dir)
    check_keys(hf.keys(), d)
    map_large_allocations()
    target = out_dir / "pretrained_weight"
    with atomic_path(target) as tmp:
        (tmp / "model").mkdir(parents=True)
        for pp_rank in range(layout.pp):
            for tp_rank in range(layout.tp):
                torchfile.save(tmp / "model" / rank_file(tp_rank, pp_rank), list(rank_entries(hf, tp_rank, pp_rank, layout, d)))
                release_freed_memory()
        record = {"layout": layout.to_json(), "attention": layout.attention, "source": str(model_dir), "hf_config": cfg}
        write_json(tmp / LAYOUT_FILE, record)
        log.info("sharded %s -> %s (tp %d, pp %d, %s)", model_dir, target, layout.tp, layout.pp, layout.attention)
    return record


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="llmpipe neuron-shard", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", required=True, help="HF model folder (config.json + safetensors or .bin)")
    p.add_argument("--out", required=True, help="NxD checkpoint dir (run_llama_nxd.py --checkpoint_dir)")
    p.add_argument(
        "--layout",
        required=True,
        help="JSON: tp, pp, vpp, kv_size_multiplier, qkv_linear, fuse_qkv, coalesce_qkv "
        "(or a config JSON with `neuron` and `parallel` sections)",
    )
    args = p.parse_args(argv)
    spec = json.loads(args.layout)
    try:
        shard(args.model, args.out, Layout.from_config(spec))
    except ValueError as exc:  # weights missing or unreadable, a layout the model does not fit: named
        raise SystemExit(f"llmpipe neuron-shard: {exc}") from None
