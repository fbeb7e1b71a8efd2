"""neuron-merge: NxD rank files -> an HF model folder (safetensors + config.json + tokenizer).

  python -m llmpipe neuron-merge --checkpoint-dir CKPT_DIR --tokenizer TOK --out FINAL [--step latest|N|pretrained]

Reads CKPT_DIR/step_<N>/model/dp_rank_00_tp_rank_XX_pp_rank_YY.pt (xser reference file + .tensors
folder, or plain torch.save) of the newest step with a `done` marker (or --step N, or the
pretrained_weight shards), with the layout and HF config that neuron-shard recorded in
CKPT_DIR/pretrained_weight/nxd_layout.json. Inverse of neuron-shard: fused QKV is split by the real
per-rank sizes (q heads/tp x head_dim, then kv rows), not in equal thirds as NxD's converter does;
replicated KV heads are taken from their first replica (and checked against the others); the trn1
query-head regrouping of q_proj and o_proj is undone. Output tensors stream into safetensors files of
at most --max-shard-gb each (+ index), cast to --dtype (bfloat16 by default).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from pathlib import Path
from typing import Iterator

import torch
from safetensors.torch import save_file

from llmpipe.backends.neuron.layout import Dims, Layout, kv_rows, layer_pp_rank, q_group, q_rows, rank_file
from llmpipe.backends.neuron.shard import LAYOUT_FILE
from llmpipe.backends.neuron.xser import RankFile
from llmpipe.io import atomic_path, write_json

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
STEP_RE = re.compile(r"^step_(\d+)$")
IGNORED = ("rotary_emb.",)  # buffers a trainer may save; not weights of the HF model


def complete_steps(ckpt_dir: Path) -> list[int]:
    """Training steps under an NxD checkpoint dir that have their `done` marker, ascending."""
    if not ckpt_dir.is_dir():
        return []
    return sorted(int(m.group(1)) for p in ckpt_dir.iterdir()
                  if (m := STEP_RE.match(p.name)) and (p / "done").is_file() and (p / "model").is_dir())


def model_dir(ckpt_dir: Path, step: str) -> tuple[Path, str]:
    """The rank files' folder for --step latest | pretrained | N."""
    if step == "pretrained":
        return ckpt_dir / "pretrained_weight" / "model", "pretrained_weight"
    steps = complete_steps(ckpt_dir)
    if step == "latest":
        if not steps:
            raise FileNotFoundError(f"{ckpt_dir}: no complete step_<N> (with a `done` marker); "
                                    f"--step pretrained converts the initial shards")
        return ckpt_dir / f"step_{steps[-1]}" / "model", f"step_{steps[-1]}"
    if not step.isdigit() or int(step) not in steps:
        raise FileNotFoundError(f"{ckpt_dir}: step {step!r} is not a complete checkpoint; complete: {steps}")
    return ckpt_dir / f"step_{int(step)}" / "model", f"step_{int(step)}"


def attention_names(p: str, style: str) -> list[str]:
    a = f"{p}.self_attn"
    qkv = {"qkv_linear_fused": ["qkv_proj.weight_qkv"], "coalesced": ["qkv_proj.weight"],
           "qkv_linear": ["qkv_proj.weight_q", "qkv_proj.weight_k", "qkv_proj.weight_v"],
           "separate": ["q_proj.weight", "k_proj.weight", "v_proj.weight"]}[style]
    return [f"{a}.{n}" for n in qkv] + [f"{a}.o_proj.weight"]


def expected_names(pp_rank: int, layout: Layout, d: Dims) -> set[str]:
    names = {"model.embed_tokens.weight"} if pp_rank == 0 else set()
    for i, owner in enumerate(layer_pp_rank(d.layers, layout.pp, layout.vpp)):
        if owner == pp_rank:
            p = f"model.layers.{i}"
            names |= {f"{p}.input_layernorm.weight", f"{p}.post_attention_layernorm.weight",
                      f"{p}.mlp.gate_up_proj.weight", f"{p}.mlp.down_proj.weight", *attention_names(p, layout.attention)}
    if pp_rank == layout.pp - 1:
        names |= {"model.norm.weight", "lm_head.weight"}
    return names


class Shards:
    """The rank files of one checkpoint, checked against the layout before anything is merged."""

    def __init__(self, folder: Path, layout: Layout, d: Dims):
        self.folder, self.layout, self.d = folder, layout, d
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: no such folder")
        beyond = [f for f in (rank_file(layout.tp, 0), rank_file(0, layout.pp)) if (folder / f).exists()]
        if beyond:
            raise ValueError(f"{folder} has rank files beyond the layout ({', '.join(beyond)}): "
                             f"the checkpoint was written with another tp/pp than {layout.to_json()}")
        self.files = {(t, p): RankFile(folder / rank_file(t, p)) for p in range(layout.pp) for t in range(layout.tp)}
        for (t, p), f in self.files.items():
            want, have = expected_names(p, layout, d), {k for k in f.keys() if not any(s in k for s in IGNORED)}
            if want != have:
                raise ValueError(f"{f.path} does not match layout {layout.attention} (tp {layout.tp}, pp {layout.pp}): "
                                 f"missing {sorted(want - have)[:6]}, unexpected {sorted(have - want)[:6]}")

    def get(self, t: int, p: int, name: str) -> torch.Tensor:
        return self.files[(t, p)].get(name)

    def cat(self, p: int, name: str, dim: int) -> torch.Tensor:
        return torch.cat([self.get(t, p, name) for t in range(self.layout.tp)], dim)


def _attention(s: Shards, p: int, i: int) -> dict[str, torch.Tensor]:
    layout, d, tp = s.layout, s.d, s.layout.tp
    a = f"model.layers.{i}.self_attn"
    nq = d.heads // tp * d.head_dim
    q, k, v = [], [], []
    for t in range(tp):
        nkv = kv_rows(t, layout, d)[1] - kv_rows(t, layout, d)[0]
        if layout.attention in ("qkv_linear_fused", "coalesced"):
            fused = s.get(t, p, f"{a}.qkv_proj.weight_qkv" if layout.qkv_linear else f"{a}.qkv_proj.weight")
            if fused.shape[0] != nq + 2 * nkv:
                raise ValueError(f"{a} on tp rank {t}: fused QKV has {fused.shape[0]} rows, expected {nq} + 2 x {nkv}")
            parts = torch.split(fused, [nq, nkv, nkv], 0)
        elif layout.qkv_linear:
            parts = [s.get(t, p, f"{a}.qkv_proj.weight_{x}") for x in "qkv"]
        else:
            parts = [s.get(t, p, f"{a}.{x}_proj.weight") for x in "qkv"]
        q.append(parts[0]), k.append(parts[1]), v.append(parts[2])
    order = sorted(range(tp), key=lambda t: q_group(t, layout, d))  # rank holding query group 0, 1, ...
    o = [s.get(t, p, f"{a}.o_proj.weight") for t in range(tp)]
    out = {f"{a}.q_proj.weight": torch.cat([q[t] for t in order], 0)}
    if layout.qkv_linear:
        kv = d.kv_heads  # rank t holds KV head t % kv; ranks 0..kv-1 are the first replica
        for name, parts in (("k_proj", k), ("v_proj", v)):
            for t in range(kv, tp):
                if not torch.equal(parts[t], parts[t % kv]):
                    log.warning("%s.%s: replica on tp rank %d differs from tp rank %d (max |diff| %.3g); "
                                "keeping the first replica", a, name, t, t % kv,
                                (parts[t].float() - parts[t % kv].float()).abs().max().item())
            out[f"{a}.{name}.weight"] = torch.cat(parts[:kv], 0)
    else:
        out[f"{a}.k_proj.weight"], out[f"{a}.v_proj.weight"] = torch.cat(k, 0), torch.cat(v, 0)
    out[f"{a}.o_proj.weight"] = torch.cat([o[t] for t in order], 1)
    return dict(sorted(out.items(), key=lambda kv_: ["q_proj", "k_proj", "v_proj", "o_proj"].index(kv_[0].split(".")[-2])))


def hf_tensors(s: Shards) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) in HF order: embeddings, layers, norm, lm_head."""
    layout, d = s.layout, s.d
    yield "model.embed_tokens.weight", s.cat(0, "model.embed_tokens.weight", 0)
    for i, p in enumerate(layer_pp_rank(d.layers, layout.pp, layout.vpp)):
        pre = f"model.layers.{i}"
        yield f"{pre}.input_layernorm.weight", s.get(0, p, f"{pre}.input_layernorm.weight")
        yield from _attention(s, p, i).items()
        yield f"{pre}.post_attention_layernorm.weight", s.get(0, p, f"{pre}.post_attention_layernorm.weight")
        gate, up = zip(*(torch.chunk(s.get(t, p, f"{pre}.mlp.gate_up_proj.weight"), 2, 0) for t in range(layout.tp)))
        yield f"{pre}.mlp.gate_proj.weight", torch.cat(gate, 0)
        yield f"{pre}.mlp.up_proj.weight", torch.cat(up, 0)
        yield f"{pre}.mlp.down_proj.weight", s.cat(p, f"{pre}.mlp.down_proj.weight", 1)
    last = layout.pp - 1
    yield "model.norm.weight", s.get(0, last, "model.norm.weight")
    yield "lm_head.weight", s.cat(last, "lm_head.weight", 0)


def merge(ckpt_dir: str | Path, out_dir: str | Path, tokenizer: str | Path | None = None, step: str = "latest",
          dtype: str = "bfloat16", layout: Layout | None = None, hf_config: dict | None = None,
          max_shard_bytes: int = 5 << 30) -> dict:
    ckpt_dir = Path(ckpt_dir)
    record_path = ckpt_dir / "pretrained_weight" / LAYOUT_FILE
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    cfg = dict(hf_config or record.get("hf_config") or {})
    if not cfg:
        raise FileNotFoundError(f"{record_path} is missing: give the HF config (--hf-config) and --layout")
    layout = layout or Layout(**record["layout"])
    d = Dims.from_hf_config(cfg)
    layout = layout.check(d)
    folder, tag = model_dir(ckpt_dir, str(step))
    shards = Shards(folder, layout, d)
    torch_dtype = DTYPES[dtype]

    tied = d.tied
    if tied:  # NxD trains its own lm_head: keep the tie only if it still holds
        same = torch.equal(shards.cat(0, "model.embed_tokens.weight", 0), shards.cat(layout.pp - 1, "lm_head.weight", 0))
        if not same:
            log.warning("tie_word_embeddings is set but lm_head differs from embed_tokens after training: "
                        "writing both and tie_word_embeddings false")
            tied = False
    cfg["tie_word_embeddings"] = tied

    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        weight_map, batch, size, files = {}, {}, 0, []

        def flush():
            nonlocal batch, size
            if batch:
                name = f"part-{len(files):05d}.safetensors"
                save_file(batch, str(tmp / name), metadata={"format": "pt"})
                files.append(name)
                weight_map.update({k: name for k in batch})
                batch, size = {}, 0

        for name, tensor in hf_tensors(shards):
            if tied and name == "lm_head.weight":
                continue
            t = tensor.to(torch_dtype).contiguous()
            nbytes = t.numel() * t.element_size()
            if batch and size + nbytes > max_shard_bytes:
                flush()
            batch[name], size = t, size + nbytes
        flush()
        weight_map = _name_files(tmp, files, weight_map)
        from transformers import LlamaConfig

        config = LlamaConfig.from_dict(cfg)
        config.dtype = torch_dtype
        config.architectures = ["LlamaForCausalLM"]
        config.save_pretrained(str(tmp))
        if tokenizer:
            from llmpipe.data.tokenizer import load_tokenizer

            load_tokenizer(tokenizer).save_pretrained(str(tmp))
        summary = {"source": str(folder), "tag": tag, "layout": layout.to_json(), "attention": layout.attention,
                   "dtype": dtype, "tie_word_embeddings": tied, "files": sorted(set(weight_map.values()))}
        write_json(tmp / "merge.json", summary)
    log.info("merged %s -> %s (%s, %d file(s))", folder, out_dir, dtype, len(summary["files"]))
    return summary


def _name_files(folder: Path, files: list[str], weight_map: dict) -> dict:
    """HF names: model.safetensors, or model-0000i-of-0000n.safetensors + model.safetensors.index.json."""
    if len(files) == 1:
        (folder / files[0]).rename(folder / "model.safetensors")
        return {k: "model.safetensors" for k in weight_map}
    names = {f: f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i, f in enumerate(files)}
    for old, new in names.items():
        (folder / old).rename(folder / new)
    total = sum((folder / n).stat().st_size for n in names.values())
    index = {"metadata": {"total_size": total}, "weight_map": {k: names[v] for k, v in weight_map.items()}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return index["weight_map"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe neuron-merge", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint-dir", required=True, help="NxD checkpoint dir (run_llama_nxd.py --checkpoint_dir)")
    p.add_argument("--out", required=True)
    p.add_argument("--tokenizer", help="HF tokenizer folder copied into the output")
    p.add_argument("--step", default="latest", help="latest (newest step with `done`), a step number, or pretrained")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--layout", help="JSON layout (default: the one neuron-shard recorded)")
    p.add_argument("--hf-config", help="HF model folder whose config.json to use (default: the recorded one)")
    p.add_argument("--max-shard-gb", type=float, default=5.0)
    args = p.parse_args(argv)
    layout = None
    if args.layout:
        spec = json.loads(args.layout)
        layout = Layout.from_config(spec.get("neuron", spec))
    cfg = json.loads((Path(args.hf_config) / "config.json").read_text()) if args.hf_config else None
    merge(args.checkpoint_dir, args.out, args.tokenizer, args.step, args.dtype, layout, cfg,
          int(args.max_shard_gb * (1 << 30)))
