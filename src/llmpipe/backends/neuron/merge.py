"""neuron-merge: NxD rank files -> an HF model folder (safetensors + config.json + tokenizer).

  python -m llmpipe neuron-merge --checkpoint-dir CKPT_DIR --tokenizer TOK --out FINAL [--step latest|N|pretrained]

Reads CKPT_DIR/step_<N>/model/dp_rank_00_tp_rank_XX_pp_rank_YY.pt (xser reference file + .tensors
folder, or plain torch.save; also NxD's older names tp_rank_XX_pp_rank_YY (xser) and
tp_rank_XX_pp_rank_YY/checkpoint.pt) of the newest step with a `done` marker (or --step N, or the
pretrained_weight shards), with the layout and HF config that neuron-shard recorded in
CKPT_DIR/pretrained_weight/nxd_layout.json. Inverse of neuron-shard: fused QKV is split by the real
per-rank sizes (q heads/tp x head_dim, then kv rows), not in equal thirds as NxD's converter does;
replicated KV heads are taken from their first replica (and checked against the others); the trn1
query-head regrouping of q_proj and o_proj is undone. Output tensors stream into safetensors files of
at most --max-shard-gb each (+ index), written as they are merged (one tensor in memory), cast to
--dtype (bfloat16 by default).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import struct
from collections.abc import Iterator
from pathlib import Path

import torch

from llmpipe.backends.neuron.layout import Dims, Layout, find_rank_file, kv_head, kv_rows, layer_pp_rank, q_group, rank_candidates
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
    return sorted(
        int(m.group(1))
        for p in ckpt_dir.iterdir()
        if (m := STEP_RE.match(p.name)) and (p / "done").is_file() and (p / "model").is_dir()
    )


def model_dir(ckpt_dir: Path, step: str) -> tuple[Path, str]:
    """The rank files' folder for --step latest | pretrained | N."""
    if step == "pretrained":
        return ckpt_dir / "pretrained_weight" / "model", "pretrained_weight"
    steps = complete_steps(ckpt_dir)
    if step == "latest":
        if not steps:
            raise FileNotFoundError(
                f"{ckpt_dir}: no complete step_<N> (with a `done` marker); --step pretrained converts the initial shards"
            )
        return ckpt_dir / f"step_{steps[-1]}" / "model", f"step_{steps[-1]}"
    if not step.isdigit() or int(step) not in steps:
        raise FileNotFoundError(f"{ckpt_dir}: step {step!r} is not a complete checkpoint; complete: {steps}")
    return ckpt_dir / f"step_{int(step)}" / "model", f"step_{int(step)}"


def attention_names(p: str, style: str) -> list[str]:
    a = f"{p}.self_attn"
    qkv = {
        "qkv_linear_fused": ["qkv_proj.weight_qkv"],
        "coalesced": ["qkv_proj.weight"],
        "qkv_linear": ["qkv_proj.weight_q", "qkv_proj.weight_k", "qkv_proj.weight_v"],
        "separate": ["q_proj.weight", "k_proj.weight", "v_proj.weight"],
    }[style]
    return [f"{a}.{n}" for n in qkv] + [f"{a}.o_proj.weight"]


def expected_names(pp_rank: int, layout: Layout, d: Dims) -> set[str]:
    names = {"model.embed_tokens.weight"} if pp_rank == 0 else set()
    for i, owner in enumerate(layer_pp_rank(d.layers, layout.pp, layout.vpp)):
        if owner == pp_rank:
            p = f"model.layers.{i}"
            names |= {
                f"{p}.input_layernorm.weight",
                f"{p}.post_attention_layernorm.weight",
                f"{p}.mlp.gate_up_proj.weight",
                f"{p}.mlp.down_proj.weight",
                *attention_names(p, layout.attention),
            }
    if pp_rank == layout.pp - 1:
        names |= {"model.norm.weight", "lm_head.weight"}
    return names


class Shards:
    """The rank files of one checkpoint, checked against the layout before anything is merged."""

    def __init__(self, folder: Path, layout: Layout, d: Dims):
        self.folder, self.layout, self.d = folder, layout, d
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: no such folder")
        beyond = [
            str(f.relative_to(folder)) for f in (find_rank_file(folder, layout.tp, 0), find_rank_file(folder, 0, layout.pp)) if f
        ]
        if beyond:
            raise ValueError(
                f"{folder} has rank files beyond the layout ({', '.join(beyond)}): "
                f"the checkpoint was written with another tp/pp than {layout.to_json()}"
            )
        self.files = {}
        for p in range(layout.pp):
            for t in range(layout.tp):
                found = find_rank_file(folder, t, p)
                if found is None:
                    raise FileNotFoundError(f"NxD rank file missing: {folder} has none of {', '.join(rank_candidates(t, p))}")
                self.files[(t, p)] = RankFile(found)
        for (_, p), f in self.files.items():
            want, have = expected_names(p, layout, d), {k for k in f.keys() if not any(s in k for s in IGNORED)}
            if want != have:
                raise ValueError(
                    f"{f.path} does not match layout {layout.attention} (tp {layout.tp}, pp {layout.pp}): "
                    f"missing {sorted(want - have)[:6]}, unexpected {sorted(have - want)[:6]}"
                )

    def release(self, p: int) -> None:
        """Drop pp rank p's files (their memory maps go with the last tensor that uses them)."""
        for t in range(self.layout.tp):
            self.files.pop((t, p), None)

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
        first = {}  # KV head -> the first rank holding it (trn1: ranks 0..kv-1; trn2: every M-th rank)
        for t in range(tp):
            first.setdefault(kv_head(t, layout, d), t)
        for name, parts in (("k_proj", k), ("v_proj", v)):
            for t in range(tp):
                f = first[kv_head(t, layout, d)]
                if t != f and not torch.equal(parts[t], parts[f]):
                    log.warning(
                        "%s.%s: replica on tp rank %d differs from tp rank %d (max |diff| %.3g); keeping the first replica",
                        a,
                        name,
                        t,
                        f,
                        (parts[t].float() - parts[f].float()).abs().max().item(),
                    )
            out[f"{a}.{name}.weight"] = torch.cat([parts[first[h]] for h in range(d.kv_heads)], 0)
    else:
        out[f"{a}.k_proj.weight"], out[f"{a}.v_proj.weight"] = torch.cat(k, 0), torch.cat(v, 0)
    out[f"{a}.o_proj.weight"] = torch.cat([o[t] for t in order], 1)
    return dict(sorted(out.items(), key=lambda kv_: ["q_proj", "k_proj", "v_proj", "o_proj"].index(kv_[0].split(".")[-2])))


def hf_tensors(s: Shards) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) in HF order: embeddings, layers, norm, lm_head."""
    layout, d = s.layout, s.d
    yield "model.embed_tokens.weight", s.cat(0, "model.embed_tokens.weight", 0)
    owners = layer_pp_rank(d.layers, layout.pp, layout.vpp)
    for i, p in enumerate(owners):
        pre = f"model.layers.{i}"
        yield f"{pre}.input_layernorm.weight", s.get(0, p, f"{pre}.input_layernorm.weight")
        yield from _attention(s, p, i).items()
        yield f"{pre}.post_attention_layernorm.weight", s.get(0, p, f"{pre}.post_attention_layernorm.weight")
        gate, up = zip(*(torch.chunk(s.get(t, p, f"{pre}.mlp.gate_up_proj.weight"), 2, 0) for t in range(layout.tp)))
        yield f"{pre}.mlp.gate_proj.weight", torch.cat(gate, 0)
        yield f"{pre}.mlp.up_proj.weight", torch.cat(up, 0)
        yield f"{pre}.mlp.down_proj.weight", s.cat(p, f"{pre}.mlp.down_proj.weight", 1)
        if layout.vpp == 1 and p < layout.pp - 1 and owners[i + 1] != p:
            s.release(p)  # this pp rank is done (the last one still holds norm and lm_head)
    last = layout.pp - 1
    yield "model.norm.weight", s.get(0, last, "model.norm.weight")
    yield "lm_head.weight", s.cat(last, "lm_head.weight", 0)


def hf_shapes(d: Dims, tied: bool) -> list[tuple[str, tuple]]:
    """(name, shape) of the HF Llama's tensors in the order hf_tensors yields them."""
    h, q, kv = d.hidden, d.heads * d.head_dim, d.kv_heads * d.head_dim
    out = [("model.embed_tokens.weight", (d.vocab, h))]
    for i in range(d.layers):
        p = f"model.layers.{i}"
        out += [
            (f"{p}.input_layernorm.weight", (h,)),
            (f"{p}.self_attn.q_proj.weight", (q, h)),
            (f"{p}.self_attn.k_proj.weight", (kv, h)),
            (f"{p}.self_attn.v_proj.weight", (kv, h)),
            (f"{p}.self_attn.o_proj.weight", (h, q)),
            (f"{p}.post_attention_layernorm.weight", (h,)),
            (f"{p}.mlp.gate_proj.weight", (d.intermediate, h)),
            (f"{p}.mlp.up_proj.weight", (d.intermediate, h)),
            (f"{p}.mlp.down_proj.weight", (h, d.intermediate)),
        ]
    out.append(("model.norm.weight", (h,)))
    if not tied:
        out.append(("lm_head.weight", (d.vocab, h)))
    return out


def plan_files(shapes: list[tuple[str, tuple]], dtype: torch.dtype, max_bytes: int) -> dict[str, list]:
    """Tensors per output file, in order, each file at most max_bytes (HF names: model.safetensors, or
    model-0000i-of-0000n.safetensors)."""
    size = torch.empty((), dtype=dtype).element_size()
    groups, current, used = [], [], 0
    for name, shape in shapes:
        nbytes = math.prod(shape) * size
        if current and used + nbytes > max_bytes:
            groups.append(current)
            current, used = [], 0
        current.append((name, shape))
        used += nbytes
    groups.append(current)
    if len(groups) == 1:
        return {"model.safetensors": groups[0]}
    return {f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors": g for i, g in enumerate(groups)}


ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def write_safetensors(path: Path, entries: list[tuple[str, tuple]], tensors, dtype: torch.dtype) -> None:
    """Stream tensors into one safetensors file: the header (known from the shapes) first, then each
    tensor's bytes as it is produced, so only one tensor is in memory (safetensors' save_file needs
    them all). The format: 8-byte little-endian header size, JSON header (padded to 8 bytes), data."""
    size = torch.empty((), dtype=dtype).element_size()
    header, at = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in entries:
        n = math.prod(shape) * size
        header[name] = {"dtype": ST_DTYPES[dtype], "shape": list(shape), "data_offsets": [at, at + n]}
        at += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for name, shape in entries:
            got, t = next(tensors)
            if got != name or tuple(t.shape) != tuple(shape):
                raise ValueError(f"merge: expected {name} {shape}, got {got} {tuple(t.shape)}")
            t = t.to(dtype).contiguous()
            fh.write(memoryview(t.view(-1).view(torch.uint8).numpy()))


def merge(
    ckpt_dir: str | Path,
    out_dir: str | Path,
    tokenizer: str | Path | None = None,
    step: str = "latest",
    dtype: str = "bfloat16",
    layout: Layout | None = None,
    hf_config: dict | None = None,
    max_shard_bytes: int = 5 << 30,
) -> dict:
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
            log.warning(
                "tie_word_embeddings is set but lm_head differs from embed_tokens after training: "
                "writing both and tie_word_embeddings false"
            )
            tied = False
    cfg["tie_word_embeddings"] = tied

    plan = plan_files(hf_shapes(d, tied), torch_dtype, max_shard_bytes)
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        tensors = ((n, t) for n, t in hf_tensors(shards) if not (tied and n == "lm_head.weight"))
        for fname, entries in plan.items():
            write_safetensors(tmp / fname, entries, tensors, torch_dtype)
        if (extra := next(tensors, None)) is not None:
            raise ValueError(f"merge: {extra[0]} was not planned")
        weight_map = {name: fname for fname, entries in plan.items() for name, _ in entries}
        if len(plan) > 1:
            total = sum((tmp / f).stat().st_size for f in plan)
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        from transformers import LlamaConfig

        from llmpipe.model.hf_compat import add_legacy_rope

        config = LlamaConfig.from_dict(cfg)
        config.dtype = torch_dtype
        config.architectures = ["LlamaForCausalLM"]
        config.save_pretrained(str(tmp))
        add_legacy_rope(tmp)
        if tokenizer:
            from llmpipe.data.tokenizer import load_tokenizer

            load_tokenizer(tokenizer).save_pretrained(str(tmp))
        summary = {
            "source": str(folder),
            "tag": tag,
            "layout": layout.to_json(),
            "attention": layout.attention,
            "dtype": dtype,
            "tie_word_embeddings": tied,
            "files": sorted(set(weight_map.values())),
        }
        write_json(tmp / "merge.json", summary)
    log.info("merged %s -> %s (%s, %d file(s))", folder, out_dir, dtype, len(summary["files"]))
    return summary


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="llmpipe neuron-merge", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
        layout = Layout.from_config(spec)
    cfg = json.loads((Path(args.hf_config) / "config.json").read_text()) if args.hf_config else None
    merge(args.checkpoint_dir, args.out, args.tokenizer, args.step, args.dtype, layout, cfg, int(args.max_shard_gb * (1 << 30)))
