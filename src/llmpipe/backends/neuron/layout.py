"""The NxD layout of a Llama: tensor / pipeline parallel degrees, KV replication and the attention
module NxD's Llama (modeling_llama_nxd.py) builds, checked against the model before any work.

Which attention module the trainer builds (and so which names the rank files need):
  qkv_linear                 GQAQKVColumnParallelLinear: qkv_proj.weight_{q,k,v}, or .weight_qkv with fuse_qkv
  fuse_qkv, MHA, no qkv_linear   ColumnParallelLinear(stride 3): qkv_proj.weight = per rank [q_r; k_r; v_r]
                                 (the converter's coalesce_qkv)
  otherwise                  q_proj / k_proj / v_proj, each split on dim 0

KV replication with qkv_linear (kv_size_multiplier M = tp / kv heads, one KV head per rank) follows the
hardware the trainer runs on (NxD's qkv_linear.py picks it from the platform):
  trn1  interleaved: rank r holds KV head r % kv; query heads regrouped so each rank holds its KV
        head's queries (as NxD's checkpoint converter writes them)
  trn2  blocked: rank r holds KV head r // M (torch.repeat_interleave in qkv_linear.py; KV-shared
        groups of M adjacent ranks in parallel_state.py); query heads stay in order, heads/tp per rank.
        NxD's converter (fbac349) writes trn2 K/V with .repeat (trn1's order), which pairs most ranks'
        queries with the wrong KV head; this layout follows the trainer instead.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path


class LayoutError(ValueError):
    """The NxD layout does not fit the model (raised before any work)."""


def data_parallel(parallel: dict) -> int:
    """DP: the NeuronCores of the job (parallel.nproc_per_node x nnodes) over tp x pp (which must divide them)."""
    return parallel["nproc_per_node"] * parallel["nnodes"] // (parallel["tp"] * parallel["pp"])


@dataclass(frozen=True)
class Dims:
    """The Llama shapes the layout depends on (from an HF config.json)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @classmethod
    def from_hf_config(cls, cfg: dict) -> Dims:
        if cfg.get("model_type", "llama") != "llama":
            raise LayoutError(
                f"the neuron backend shards Llama checkpoints; config.json has model_type {cfg.get('model_type')!r}"
            )
        heads = cfg["num_attention_heads"]
        hidden = cfg["hidden_size"]
        if hidden % heads or cfg.get("head_dim", hidden // heads) != hidden // heads:
            raise LayoutError(
                f"NxD's Llama needs head_dim = hidden_size / num_attention_heads "
                f"(hidden_size {hidden}, heads {heads}, head_dim {cfg.get('head_dim')})"
            )
        if cfg.get("attention_bias") or cfg.get("mlp_bias"):
            raise LayoutError("NxD's Llama has no attention or MLP biases (attention_bias / mlp_bias are set)")
        return cls(
            layers=cfg["num_hidden_layers"],
            hidden=hidden,
            heads=heads,
            kv_heads=cfg.get("num_key_value_heads") or heads,
            intermediate=cfg["intermediate_size"],
            vocab=cfg["vocab_size"],
            tied=bool(cfg.get("tie_word_embeddings", False)),
        )


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    vpp: int = 1  # virtual pipeline stages per pp rank
    kv_size_multiplier: int = 1  # --kv_replicator
    qkv_linear: bool = False
    fuse_qkv: bool = True  # both NxD Llama trainers default to 1
    coalesce_qkv: bool | None = None  # None: what the trainer builds (fuse_qkv and MHA and not qkv_linear)
    hw_backend: str = "trn1"  # trn1 | trn2: the KV replication order (module docstring)

    @classmethod
    def from_config(cls, spec: dict) -> Layout:
        """A flat layout, or a config: its neuron section with parallel.tp / pp."""
        if "neuron" in spec:
            spec = {**spec["neuron"], **{k: v for k, v in spec.get("parallel", {}).items() if k in ("tp", "pp")}}
        keys = ("tp", "pp", "vpp", "kv_size_multiplier", "qkv_linear", "fuse_qkv", "coalesce_qkv", "hw_backend")
        return cls(**{k: spec[k] for k in keys if k in spec})

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def attention(self) -> str:
        """qkv_linear | qkv_linear_fused | coalesced | separate (valid after `check`)."""
        if self.qkv_linear:
            return "qkv_linear_fused" if self.fuse_qkv else "qkv_linear"
        return "coalesced" if self.coalesce_qkv else "separate"

    def check(self, d: Dims) -> Layout:
        """All problems at once (LayoutError), else the layout with coalesce_qkv resolved."""
        errs = [] if self.hw_backend in ("trn1", "trn2") else [f"hw_backend {self.hw_backend!r}: trn1 or trn2"]
        for name in ("tp", "pp", "vpp", "kv_size_multiplier"):
            if getattr(self, name) < 1:
                errs.append(f"{name} must be >= 1 (got {getattr(self, name)})")
        if errs:
            raise LayoutError("invalid neuron layout: " + "; ".join(errs))
        tp, kvm, mha = self.tp, self.kv_size_multiplier, d.heads == d.kv_heads
        if d.heads % tp:
            errs.append(f"tp {tp} must divide num_attention_heads {d.heads}")
        if d.intermediate % tp:
            errs.append(f"tp {tp} must divide intermediate_size {d.intermediate}")
        if d.vocab % tp:
            errs.append(f"tp {tp} must divide vocab_size {d.vocab} (pad the vocabulary: model.vocab_multiple)")
        if d.layers < self.pp * self.vpp:
            errs.append(f"pp {self.pp} x vpp {self.vpp} stages exceed num_hidden_layers {d.layers}")
        coalesce = self.coalesce_qkv
        if self.qkv_linear:
            if tp == 1:
                errs.append("qkv_linear needs tp > 1 (NxD's GQA QKV layer fails at tp 1): set qkv_linear false")
            elif tp % d.kv_heads:
                errs.append(
                    f"qkv_linear needs tp ({tp}) to be a multiple of num_key_value_heads ({d.kv_heads}); "
                    f"with tp < kv heads train with qkv_linear false"
                )
            elif kvm != tp // d.kv_heads:
                errs.append(
                    f"kv_size_multiplier {kvm} must equal tp / num_key_value_heads = {tp // d.kv_heads} "
                    f"with qkv_linear (one KV head per rank; the trainer gets the same value as --kv_replicator)"
                )
            if self.fuse_qkv and mha:  # modeling_llama_nxd.py LlamaAttention.forward's first branch
                errs.append(
                    "qkv_linear with fuse_qkv on an MHA model (num_key_value_heads == num_attention_heads): NxD's "
                    "attention then takes its coalesced branch and splits the GQA layer's output (a tuple) on the "
                    "first step: set fuse_qkv false (q/k/v in the GQA layer), or qkv_linear false (coalesced qkv_proj)"
                )
            if coalesce:
                errs.append("coalesce_qkv applies without qkv_linear only (qkv_linear has its own fused layout: fuse_qkv)")
            coalesce = False
        else:
            if kvm != 1:
                errs.append(f"kv_size_multiplier {kvm} needs qkv_linear (KV replication exists only in NxD's GQA QKV layer)")
            if d.kv_heads % tp:
                errs.append(
                    f"tp {tp} must divide num_key_value_heads {d.kv_heads} without qkv_linear "
                    f"(or use qkv_linear with kv_size_multiplier = tp / kv heads)"
                )
            builds = self.fuse_qkv and mha  # modeling_llama_nxd.py: fused qkv_proj only for MHA with fuse_qkv
            if coalesce is None:
                coalesce = builds
            elif coalesce and not mha:
                errs.append(f"coalesce_qkv needs MHA (num_key_value_heads {d.kv_heads} != num_attention_heads {d.heads})")
            elif coalesce != builds:
                errs.append(
                    f"coalesce_qkv {coalesce} does not match the module NxD's Llama builds with fuse_qkv "
                    f"{self.fuse_qkv} and {'MHA' if mha else 'GQA'} ({'fused qkv_proj' if builds else 'q/k/v_proj'}): "
                    f"leave coalesce_qkv null"
                )
        if errs:
            raise LayoutError("invalid neuron layout: " + "; ".join(errs))
        return Layout(tp, self.pp, self.vpp, kvm, self.qkv_linear, self.fuse_qkv, bool(coalesce), self.hw_backend)


def stage_layers(layers: int, stages: int) -> list[int]:
    """Layers per pipeline stage as NxD's create_partitions splits them: even, remainder to the LATER stages."""
    counts = [layers // stages] * stages
    for i in range(stages - layers % stages, stages):
        counts[i] += 1
    return counts


def layer_pp_rank(layers: int, pp: int, vpp: int = 1) -> list[int]:
    """pp rank of every layer: stage s holds a contiguous run of layers, stage -> rank = s % pp."""
    out = []
    for stage, n in enumerate(stage_layers(layers, pp * vpp)):
        out += [stage % pp] * n
    return out


def kv_head(rank: int, layout: Layout, d: Dims) -> int:
    """The KV head tp rank `rank` holds with qkv_linear: r % kv on trn1, r // kv_size_multiplier on trn2."""
    return rank // layout.kv_size_multiplier if layout.hw_backend == "trn2" else rank % d.kv_heads


def q_group(rank: int, layout: Layout, d: Dims) -> int:
    """Which block of heads/tp consecutive query heads tp rank `rank` holds. With qkv_linear on trn1
    (interleaved KV replication: rank r holds KV head r % kv), query heads are regrouped so each rank
    holds the query heads of its KV head: group (r % kv) * (tp / kv) + r // kv. Otherwise (trn2's
    blocked replication already pairs them) group r."""
    if layout.qkv_linear and layout.hw_backend == "trn1":
        kv = d.kv_heads
        return (rank % kv) * (layout.tp // kv) + rank // kv
    return rank


def q_rows(rank: int, layout: Layout, d: Dims) -> tuple[int, int]:
    """Row range of q_proj (= column range of o_proj) on tp rank `rank`."""
    n = d.heads // layout.tp * d.head_dim
    g = q_group(rank, layout, d)
    return g * n, (g + 1) * n


def kv_rows(rank: int, layout: Layout, d: Dims) -> tuple[int, int]:
    """Row range of k_proj / v_proj on tp rank `rank`: with qkv_linear one KV head per rank (kv_head:
    trn1 interleaved, trn2 blocked replication); without qkv_linear a plain split."""
    if layout.qkv_linear:
        start = kv_head(rank, layout, d) * d.head_dim
        return start, start + d.head_dim
    n = d.kv_heads // layout.tp * d.head_dim
    return rank * n, (rank + 1) * n


def split(size: int, rank: int, tp: int) -> tuple[int, int]:
    n = size // tp
    return rank * n, (rank + 1) * n


def rank_file(tp_rank: int, pp_rank: int) -> str:
    return f"dp_rank_00_tp_rank_{tp_rank:02d}_pp_rank_{pp_rank:02d}.pt"


def rank_candidates(tp_rank: int, pp_rank: int) -> list[str]:
    """Names a rank's model file has had, in the order NxD's converter tries them: the older API's
    `tp_rank_XX_pp_rank_YY` (an xser reference file) or `tp_rank_XX_pp_rank_YY/checkpoint.pt` (torch.save),
    then today's `dp_rank_00_tp_rank_XX_pp_rank_YY.pt`."""
    old = f"tp_rank_{tp_rank:02d}_pp_rank_{pp_rank:02d}"
    return [old, f"{old}/checkpoint.pt", rank_file(tp_rank, pp_rank)]


_RANK_NAME = re.compile(r"^(?:dp_rank_\d+_)?tp_rank_(\d+)_pp_rank_(\d+)(?:\.pt|/checkpoint\.pt)?$")


def rank_files_in(folder: Path) -> dict[str, tuple[int, int]]:
    """Every rank model file in `folder` (any of rank_candidates' names): {name: (tp rank, pp rank)}."""
    out = {}
    for f in [*folder.glob("*tp_rank_*_pp_rank_*"), *folder.glob("tp_rank_*_pp_rank_*/checkpoint.pt")]:
        name = f.relative_to(folder).as_posix()
        if f.is_file() and (m := _RANK_NAME.match(name)):
            out[name] = (int(m[1]), int(m[2]))
    return out


def find_rank_file(folder: Path, tp_rank: int, pp_rank: int) -> Path | None:
    for name in rank_candidates(tp_rank, pp_rank):
        if (folder / name).is_file():
            return folder / name
    return None
