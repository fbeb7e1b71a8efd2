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
at most --max-shard-gb each (+ index), cast to --dtype (bfloat16 by default). Memory: each HF tensor is
assembled in its output buffer from its rank pieces, read one at a time from disk (xser.RankFile: no
memory maps), written and freed before the next: about one tensor plus one piece.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from llmpipe.backends.neuron.layout import (
    Dims,
    Layout,
    find_rank_file,
    kv_head,
    kv_rows,
    layer_pp_rank,
    q_group,
    rank_candidates,
    rank_files_in,
)
from llmpipe.backends.neuron.resume import complete_steps
from llmpipe.backends.neuron.shard import LAYOUT_FILE
from llmpipe.backends.neuron.xser import RankFile
from llmpipe.io import atomic_path, write_json
from llmpipe.model.safetensors_out import (
    DTYPES,
    MAX_FILE_BYTES,
    Entry,
    map_large_allocations,
    not_weight,
    plan_files,
    write_index,
    write_safetensors,
)

log = logging.getLogger(__name__)


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
        beyond = [name for name, (t, p) in rank_files_in(folder).items() if t >= layout.tp or p >= layout.pp]
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
            want, have = expected_names(p, layout, d), {k for k in f.keys() if not not_weight(k)}
            if want != have:
                raise ValueError(
                    f"{f.path} does not match layout {layout.attention} (tp {layout.tp}, pp {layout.pp}): "
                    f"missing {sorted(want - have)[:6]}, unexpected {sorted(have - want)[:6]}"
                )

    def get(self, t: int, p: int, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rank (t, p)'s tensor `name` (or its rows [start, stop)), read from disk."""
        return self.files[(t, p)].get(name, start, stop)

    def shape(self, t: int, p: int, name: str) -> tuple:
        return self.files[(t, p)].shape(name)


# (HF name, fill): fill(out) assembles the tensor in `out` (hf_shapes' shape, the output dtype), one rank piece at a time


def put(out: torch.Tensor, piece: torch.Tensor, what: str) -> None:
    """Copy one rank's piece into its place in the output tensor (cast to the output dtype)."""
    if out.shape != piece.shape:
        raise ValueError(f"{what}: rank piece has shape {tuple(piece.shape)}, expected {tuple(out.shape)}")
    out.copy_(piece)


def cat_into(s: Shards, p: int, name: str, dim: int) -> Callable[[torch.Tensor], None]:
    """Fill: the tp ranks' pieces of `name` one after another along `dim`."""

    def fill(out: torch.Tensor) -> None:
        n = out.shape[dim] // s.layout.tp
        for t in range(s.layout.tp):
            put(out.narrow(dim, t * n, n), s.get(t, p, name), f"{name} on tp rank {t} pp rank {p}")

    return fill


def replicated(s: Shards, p: int, name: str) -> Callable[[torch.Tensor], None]:
    return lambda out: put(out, s.get(0, p, name), name)


def _qkv_pieces(s: Shards, p: int, a: str) -> tuple[int, int, Callable[[int, int], torch.Tensor]]:
    """(q rows per rank, kv rows per rank, piece(t, i): rank t's q (i 0), k (1) or v (2) rows)."""
    layout, d = s.layout, s.d
    nq = d.heads // layout.tp * d.head_dim
    nkv = kv_rows(0, layout, d)[1] - kv_rows(0, layout, d)[0]
    if layout.attention in ("qkv_linear_fused", "coalesced"):
        fused = f"{a}.qkv_proj.weight_qkv" if layout.qkv_linear else f"{a}.qkv_proj.weight"
        for t in range(layout.tp):
            if (rows := s.shape(t, p, fused)[0]) != nq + 2 * nkv:
                raise ValueError(f"{a} on tp rank {t}: fused QKV has {rows} rows, expected {nq} + 2 x {nkv}")
        starts = (0, nq, nq + nkv)
        return nq, nkv, lambda t, i: s.get(t, p, fused, starts[i], starts[i] + (nq, nkv, nkv)[i])
    names = [f"{a}.qkv_proj.weight_{x}" if layout.qkv_linear else f"{a}.{x}_proj.weight" for x in "qkv"]
    return nq, nkv, lambda t, i: s.get(t, p, names[i])


def _check_replicas(s: Shards, piece: Callable[[int], torch.Tensor], first: dict[int, int], what: str) -> None:
    """Warn where a replicated KV head differs from its first replica (training should keep them equal)."""
    for t in range(s.layout.tp):
        f = first[kv_head(t, s.layout, s.d)]
        if t != f and not torch.equal(mine := piece(t), ref := piece(f)):
            diff = (mine.float() - ref.float()).abs().max().item()
            log.warning(
                "%s: replica on tp rank %d differs from tp rank %d (max |diff| %.3g); keeping the first replica", what, t, f, diff
            )


def attention_entries(s: Shards, p: int, i: int) -> list[Entry]:
    layout, d, tp = s.layout, s.d, s.layout.tp
    a = f"model.layers.{i}.self_attn"
    nq, nkv, piece = _qkv_pieces(s, p, a)
    group = {t: q_group(t, layout, d) for t in range(tp)}  # query group g sits at rows / columns g * nq

    def q(out):
        for t in range(tp):
            put(out[group[t] * nq : (group[t] + 1) * nq], piece(t, 0), f"{a}.q_proj on tp rank {t}")

    def o(out):
        for t in range(tp):
            put(out[:, group[t] * nq : (group[t] + 1) * nq], s.get(t, p, f"{a}.o_proj.weight"), f"{a}.o_proj on tp rank {t}")

    def kv(i_kv: int, name: str):
        def fill(out):
            if not layout.qkv_linear:
                for t in range(tp):
                    put(out[t * nkv : (t + 1) * nkv], piece(t, i_kv), f"{a}.{name} on tp rank {t}")
                return
            first = {}  # KV head -> the first rank holding it (trn1: ranks 0..kv-1; trn2: every M-th rank)
            for t in range(tp):
                first.setdefault(kv_head(t, layout, d), t)
            _check_replicas(s, lambda t: piece(t, i_kv), first, f"{a}.{name}")
            for h in range(d.kv_heads):
                put(out[h * d.head_dim : (h + 1) * d.head_dim], piece(first[h], i_kv), f"{a}.{name} on tp rank {first[h]}")

        return fill

    return [
        (f"{a}.q_proj.weight", q),
        (f"{a}.k_proj.weight", kv(1, "k_proj")),
        (f"{a}.v_proj.weight", kv(2, "v_proj")),
        (f"{a}.o_proj.weight", o),
    ]


def mlp_entries(s: Shards, p: int, i: int) -> list[Entry]:
    tp, pre = s.layout.tp, f"model.layers.{i}.mlp"
    gate_up, n = f"{pre}.gate_up_proj.weight", s.d.intermediate // tp  # per rank [gate_r; up_r], n rows each

    def half(k: int):
        def fill(out):
            for t in range(tp):
                if (rows := s.shape(t, p, gate_up)[0]) != 2 * n:
                    raise ValueError(f"{gate_up} on tp rank {t}: {rows} rows, expected 2 x {n}")
                put(out[t * n : (t + 1) * n], s.get(t, p, gate_up, k * n, (k + 1) * n), f"{gate_up} on tp rank {t}")

        return fill

    return [
        (f"{pre}.gate_proj.weight", half(0)),
        (f"{pre}.up_proj.weight", half(1)),
        (f"{pre}.down_proj.weight", cat_into(s, p, f"{pre}.down_proj.weight", 1)),
    ]


def hf_entries(s: Shards) -> Iterator[Entry]:
    """(HF name, fill) in HF order (hf_shapes'): embeddings, layers, norm, lm_head."""
    layout, last = s.layout, s.layout.pp - 1
    yield "model.embed_tokens.weight", cat_into(s, 0, "model.embed_tokens.weight", 0)
    for i, p in enumerate(layer_pp_rank(s.d.layers, layout.pp, layout.vpp)):
        pre = f"model.layers.{i}"
        yield f"{pre}.input_layernorm.weight", replicated(s, p, f"{pre}.input_layernorm.weight")
        yield from attention_entries(s, p, i)
        yield f"{pre}.post_attention_layernorm.weight", replicated(s, p, f"{pre}.post_attention_layernorm.weight")
        yield from mlp_entries(s, p, i)
    yield "model.norm.weight", replicated(s, last, "model.norm.weight")
    yield "lm_head.weight", cat_into(s, last, "lm_head.weight", 0)


def still_tied(s: Shards) -> bool:
    """lm_head equals embed_tokens on every tp rank (compared piece by piece)."""
    last = s.layout.pp - 1
    return all(
        torch.equal(s.get(t, 0, "model.embed_tokens.weight"), s.get(t, last, "lm_head.weight")) for t in range(s.layout.tp)
    )


def hf_shapes(d: Dims, tied: bool) -> list[tuple[str, tuple]]:
    """(name, shape) of the HF Llama's tensors in the order hf_entries yields them."""
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


def merge(
    ckpt_dir: str | Path,
    out_dir: str | Path,
    tokenizer: str | Path | None = None,
    step: str = "latest",
    dtype: str = "bfloat16",
    layout: Layout | None = None,
    hf_config: dict | None = None,
    max_shard_bytes: int = MAX_FILE_BYTES,
) -> dict:
    ckpt_dir = Path(ckpt_dir)
    record_path = ckpt_dir / "pretrained_weight" / LAYOUT_FILE
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    cfg = dict(hf_config or record.get("hf_config") or {})
    if not cfg:
        raise FileNotFoundError(f"{record_path} is missing: give the HF config (--hf-config) and --layout")
    if layout is None and "layout" not in record:
        raise FileNotFoundError(f"{record_path} is missing: give the layout the checkpoint was written with (--layout)")
    layout = layout or Layout(**record["layout"])
    d = Dims.from_hf_config(cfg)
    layout = layout.check(d)
    folder, tag = model_dir(ckpt_dir, str(step))
    shards = Shards(folder, layout, d)
    torch_dtype = DTYPES[dtype]
    map_large_allocations()

    tied = d.tied
    if tied:  # NxD trains its own lm_head: keep the tie only if it still holds
        if not still_tied(shards):
            log.warning(
                "tie_word_embeddings is set but lm_head differs from embed_tokens after training: "
                "writing both and tie_word_embeddings false"
            )
            tied = False
    cfg["tie_word_embeddings"] = tied

    plan = plan_files(hf_shapes(d, tied), torch_dtype, max_shard_bytes)
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        tensors = (e for e in hf_entries(shards) if not (tied and e[0] == "lm_head.weight"))
        for fname, entries in plan.items():
            write_safetensors(tmp / fname, entries, tensors, torch_dtype)
        if (extra := next(tensors, None)) is not None:
            raise ValueError(f"merge: {extra[0]} was not planned")
        weight_map = write_index(tmp, plan, torch_dtype)
        from transformers import LlamaConfig

        from llmpipe.model.hf_compat import legacy_readable

        config = LlamaConfig.from_dict(cfg)
        config.dtype = torch_dtype
        config.architectures = ["LlamaForCausalLM"]
        config.save_pretrained(str(tmp))
        if tokenizer:
            from llmpipe.data.tokenizer import copy_tokenizer_files

            copy_tokenizer_files(tokenizer, tmp)
        legacy_readable(tmp)
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
