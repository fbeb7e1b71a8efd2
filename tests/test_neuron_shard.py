"""Neuron backend, checkpoint side (CPU, no Neuron packages needed): HF -> NxD rank files -> HF.

Round trips are bit-exact over tp, pp, GQA / MHA, tied / untied, every attention layout NxD's Llama
builds (qkv_linear with and without fuse_qkv, coalesced MHA, separate q/k/v) and kv_size_multiplier
> 1. The per-rank simulation proves the layout itself: column-parallel q/k/v and gate/up, row-parallel
o_proj and down_proj, computed rank by rank from the files on disk, reproduce the HF model's
attention and MLP outputs (float64), and the vocab-parallel lm_head its logits.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from llmpipe.backends.neuron.hf_reader import HFCheckpoint
from llmpipe.backends.neuron.layout import Dims, Layout, LayoutError, layer_pp_rank, q_rows, stage_layers
from llmpipe.backends.neuron.merge import merge
from llmpipe.backends.neuron.shard import shard

# (heads, kv heads, tp, pp, qkv_linear, fuse_qkv, kv_size_multiplier, tied)
CASES = [
    (8, 8, 1, 1, False, False, 1, False),  # MHA, plain q/k/v
    (8, 8, 2, 2, False, True, 1, False),  # MHA, coalesced qkv_proj
    (8, 8, 4, 4, False, False, 1, True),  # MHA, separate, tied, uneven pp split (5 layers / 4)
    (8, 8, 8, 1, False, True, 1, True),  # MHA coalesced at tp 8, tied
    (8, 8, 8, 2, True, False, 1, False),  # MHA through the GQA QKV layer (kv = tp), unfused
    (8, 2, 1, 2, False, True, 1, False),  # GQA without qkv_linear at tp 1
    (8, 2, 2, 1, False, True, 1, True),  # GQA without qkv_linear (fuse_qkv has no effect)
    (8, 2, 2, 2, True, False, 1, False),  # GQA, qkv_linear, weight_q/k/v
    (8, 2, 4, 2, True, True, 2, False),  # GQA, kvm 2, fused weight_qkv
    (8, 2, 8, 4, True, True, 4, True),  # GQA, kvm 4, fused, tied, pp 4
    (16, 4, 8, 2, True, False, 2, False),  # 2 q heads vs 1 kv head per rank, unfused
    (16, 2, 8, 1, True, True, 4, False),  # 2 q heads vs 1 kv head per rank, fused (NxD's reverse bug)
]
LAYERS = 5


def tiny_llama(tmp, heads, kv, tied, dtype=torch.float32, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=4 * heads,
        intermediate_size=48,
        num_hidden_layers=LAYERS,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        tie_word_embeddings=tied,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # distinct values everywhere (norms too), so a misplaced row cannot pass
        for p in model.parameters():
            p.normal_()
    model = model.to(dtype)
    model.save_pretrained(tmp / "hf")
    return model


def case_id(c):
    h, kv, tp, pp, lin, fuse, kvm, tied = c
    return f"h{h}kv{kv}-tp{tp}pp{pp}-{'lin' if lin else 'nolin'}-{'fused' if fuse else 'split'}-kvm{kvm}{'-tied' if tied else ''}"


def rank_state(ckpt, t, p):
    return torch.load(ckpt / "pretrained_weight" / "model" / f"dp_rank_00_tp_rank_{t:02d}_pp_rank_{p:02d}.pt", weights_only=True)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_round_trip_is_bit_exact(tmp_path, case):
    heads, kv, tp, pp, lin, fuse, kvm, tied = case
    tiny_llama(tmp_path, heads, kv, tied)
    layout = Layout(tp=tp, pp=pp, kv_size_multiplier=kvm, qkv_linear=lin, fuse_qkv=fuse)
    rec = shard(tmp_path / "hf", tmp_path / "nxd", layout)
    files = sorted(p.name for p in (tmp_path / "nxd/pretrained_weight/model").iterdir())
    assert files == sorted(f"dp_rank_00_tp_rank_{t:02d}_pp_rank_{p:02d}.pt" for t in range(tp) for p in range(pp))
    summary = merge(tmp_path / "nxd", tmp_path / "out", step="pretrained", dtype="float32")
    before, after = load_file(tmp_path / "hf/model.safetensors"), load_file(tmp_path / "out/model.safetensors")
    assert sorted(before) == sorted(after)
    for name in before:
        assert torch.equal(before[name], after[name]), name
    out_cfg = json.loads((tmp_path / "out/config.json").read_text())
    assert out_cfg["tie_word_embeddings"] is tied and summary["attention"] == rec["attention"]


TRN2_CASES = [c for c in CASES if c[4]]  # KV replication order matters only with qkv_linear


@pytest.mark.parametrize("case", TRN2_CASES, ids=case_id)
def test_trn2_round_trip_is_bit_exact(tmp_path, case):
    heads, kv, tp, pp, lin, fuse, kvm, tied = case
    tiny_llama(tmp_path, heads, kv, tied)
    layout = Layout(tp=tp, pp=pp, kv_size_multiplier=kvm, qkv_linear=lin, fuse_qkv=fuse, hw_backend="trn2")
    shard(tmp_path / "hf", tmp_path / "nxd", layout)
    summary = merge(tmp_path / "nxd", tmp_path / "out", step="pretrained", dtype="float32")
    assert summary["layout"]["hw_backend"] == "trn2"
    before, after = load_file(tmp_path / "hf/model.safetensors"), load_file(tmp_path / "out/model.safetensors")
    for name in before:
        assert torch.equal(before[name], after[name]), name


def test_round_trip_bf16_default_dtype_and_loads_in_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny_llama(tmp_path, 8, 2, False, dtype=torch.bfloat16)
    shard(tmp_path / "hf", tmp_path / "nxd", Layout(tp=4, pp=2, kv_size_multiplier=2, qkv_linear=True))
    merge(tmp_path / "nxd", tmp_path / "out", step="pretrained")  # bf16 by default
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out", trust_remote_code=False)
    assert back.dtype == torch.bfloat16
    for (n, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), n


# ---------------------------------------------------------------- per-rank simulation


def simulate_layer(ckpt, cfg, layout, layer, x, cos, sin, mask):
    """Attention and MLP outputs of `layer`, computed per tp rank from the rank files as NxD's
    column / row parallel layers do, then summed (the all-reduce of RowParallelLinear)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    heads, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    tp = layout.tp
    q_n = heads // tp  # query heads per rank
    kv_n = kv * layout.kv_size_multiplier // tp if layout.qkv_linear else kv // tp
    p = layer_pp_rank(cfg.num_hidden_layers, layout.pp)[layer]
    a, m = f"model.layers.{layer}.self_attn", f"model.layers.{layer}.mlp"
    b, s, _ = x.shape
    attn, mlp = 0, 0
    for t in range(tp):
        st = rank_state(ckpt, t, p)
        if f"{a}.qkv_proj.weight_qkv" in st or f"{a}.qkv_proj.weight" in st:
            fused = st.get(f"{a}.qkv_proj.weight_qkv", st.get(f"{a}.qkv_proj.weight"))
            wq, wk, wv = torch.split(fused, [q_n * hd, kv_n * hd, kv_n * hd], 0)
        elif f"{a}.qkv_proj.weight_q" in st:
            wq, wk, wv = (st[f"{a}.qkv_proj.weight_{c}"] for c in "qkv")
        else:
            wq, wk, wv = (st[f"{a}.{c}_proj.weight"] for c in "qkv")
        q = (x @ wq.T).view(b, s, q_n, hd).transpose(1, 2)
        k = (x @ wk.T).view(b, s, kv_n, hd).transpose(1, 2)
        v = (x @ wv.T).view(b, s, kv_n, hd).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = (z.repeat_interleave(q_n // kv_n, dim=1) for z in (k, v))
        # softmax in float32 as HF's eager attention does, so the reference differs only in rounding
        w = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(hd) + mask, dim=-1, dtype=torch.float32).to(q.dtype)
        ctx = (w @ v).transpose(1, 2).reshape(b, s, q_n * hd)
        attn = attn + ctx @ st[f"{a}.o_proj.weight"].T
        gate, up = torch.chunk(st[f"{m}.gate_up_proj.weight"], 2, 0)
        mlp = mlp + (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ st[f"{m}.down_proj.weight"].T
    return attn, mlp


SIMULATED = [(c, "trn1") for c in (CASES[1], CASES[3], CASES[6], CASES[8], CASES[9], CASES[10], CASES[11])]
SIMULATED += [(c, "trn2") for c in (CASES[4], CASES[8], CASES[9], CASES[10], CASES[11])]


@pytest.mark.parametrize("case, hw", SIMULATED, ids=[f"{case_id(c)}-{hw}" for c, hw in SIMULATED])
def test_per_rank_matmuls_reproduce_the_full_model(tmp_path, case, hw):
    """Each rank computes attention as NxD's Llama does (local query head j with local KV head
    j // (query heads / KV heads per rank)); on trn2 with trn2's blocked KV replication."""
    heads, kv, tp, pp, lin, fuse, kvm, tied = case
    model = tiny_llama(tmp_path, heads, kv, tied, dtype=torch.float64).eval()
    layout = Layout(tp=tp, pp=pp, kv_size_multiplier=kvm, qkv_linear=lin, fuse_qkv=fuse, hw_backend=hw)
    shard(tmp_path / "hf", tmp_path / "nxd", layout)
    cfg = model.config
    torch.manual_seed(1)
    x = torch.randn(2, 7, cfg.hidden_size, dtype=torch.float64)
    pos = torch.arange(7)[None].expand(2, 7)
    cos, sin = model.model.rotary_emb(x, pos)
    mask = torch.triu(torch.full((7, 7), float("-inf"), dtype=torch.float64), 1)[None, None]
    for layer in (0, LAYERS - 1):
        block = model.model.layers[layer]
        with torch.no_grad():
            want_attn, _ = block.self_attn(x, position_embeddings=(cos, sin), attention_mask=mask)
            want_mlp = block.mlp(x)
            got_attn, got_mlp = simulate_layer(tmp_path / "nxd", cfg, layout, layer, x, cos, sin, mask)
        torch.testing.assert_close(got_attn, want_attn, rtol=1e-6, atol=1e-6)  # a misplaced head is O(1) off
        torch.testing.assert_close(got_mlp, want_mlp, rtol=1e-9, atol=1e-9)
    # vocab-parallel lm_head on the last pp rank: rank logits side by side == full logits
    head = torch.cat([rank_state(tmp_path / "nxd", t, pp - 1)["lm_head.weight"] for t in range(tp)], 0)
    torch.testing.assert_close(x @ head.T, model.lm_head(x), rtol=0, atol=0)


def test_trn1_query_order_matches_nxd_documented_example():
    """NxD's converter docstring (trn1, heads 64, kv 16, kv_size_multiplier 4): query order
    [Q0, Q4, Q8, ..., Q60, Q1, Q5, ...], one query head per rank at tp 64."""
    d = Dims(layers=1, hidden=64 * 2, heads=64, kv_heads=16, intermediate=64, vocab=64, tied=False)
    layout = Layout(tp=64, kv_size_multiplier=4, qkv_linear=True).check(d)
    order = [q_rows(r, layout, d)[0] // d.head_dim for r in range(64)]
    expected = [4 * i + j for j in range(4) for i in range(16)]  # Q0, Q4, ..., Q60, Q1, Q5, ..., Q63
    assert order == expected


def test_trn2_blocked_kv_replication_with_queries_in_order():
    """Llama-3-70B on trn2 at tp 32 (heads 64, kv 8, kv_size_multiplier 4): NxD's trainer replicates each
    KV head on M = 4 adjacent ranks (repeat_interleave; KV-shared groups of adjacent ranks), so rank r holds
    KV head r // 4 and query heads 2r, 2r + 1 in order; trn1 holds KV head r % 8 with regrouped queries."""
    from llmpipe.backends.neuron.layout import kv_head, kv_rows

    d = Dims(layers=1, hidden=64 * 2, heads=64, kv_heads=8, intermediate=64, vocab=64, tied=False)
    trn2 = Layout(tp=32, kv_size_multiplier=4, qkv_linear=True, hw_backend="trn2").check(d)
    trn1 = Layout(tp=32, kv_size_multiplier=4, qkv_linear=True).check(d)
    for r in range(32):
        assert [q_rows(r, trn2, d)[0] // d.head_dim, q_rows(r, trn2, d)[1] // d.head_dim] == [2 * r, 2 * r + 2]
        assert kv_head(r, trn2, d) == r // 4 and kv_rows(r, trn2, d)[0] // d.head_dim == r // 4
        assert kv_head(r, trn1, d) == r % 8
        # every local query head's GQA group (head // (64 / 8)) is the rank's KV head, on both
        for layout in (trn1, trn2):
            first = q_rows(r, layout, d)[0] // d.head_dim
            assert {(first + j) // 8 for j in range(2)} == {kv_head(r, layout, d)}, (layout.hw_backend, r)


def test_pipeline_split_gives_the_remainder_to_later_stages():
    assert stage_layers(80, 8) == [10] * 8
    assert stage_layers(5, 4) == [1, 1, 1, 2]
    assert stage_layers(10, 4) == [2, 2, 3, 3]
    # 6 layers over 4 virtual stages [1, 1, 2, 2] -> stages 0,1,2,2,3,3 -> ranks 0,1,0,0,1,1
    assert layer_pp_rank(6, 2, vpp=2) == [0, 1, 0, 0, 1, 1]


# ---------------------------------------------------------------- validation and inputs


@pytest.mark.parametrize(
    "kwargs, heads, kv, needle",
    [
        (dict(tp=8, qkv_linear=True, kv_size_multiplier=2), 8, 2, "kv_size_multiplier 2 must equal tp / num_key_value_heads = 4"),
        (dict(tp=2, qkv_linear=True, kv_size_multiplier=1), 16, 4, "multiple of num_key_value_heads"),
        (dict(tp=1, qkv_linear=True), 8, 2, "qkv_linear needs tp > 1"),
        (dict(tp=8, qkv_linear=True, fuse_qkv=True), 8, 8, "qkv_linear with fuse_qkv on an MHA model"),
        (dict(tp=3), 8, 8, "tp 3 must divide num_attention_heads 8"),
        (dict(tp=4), 8, 2, "tp 4 must divide num_key_value_heads 2"),
        (dict(tp=2, kv_size_multiplier=2), 8, 2, "needs qkv_linear"),
        (dict(tp=2, coalesce_qkv=True), 8, 2, "coalesce_qkv needs MHA"),
        (dict(tp=2, coalesce_qkv=False), 8, 8, "leave coalesce_qkv null"),
        (dict(pp=6), 8, 8, "exceed num_hidden_layers 5"),
    ],
)
def test_invalid_layouts_stop_before_any_file_is_written(tmp_path, kwargs, heads, kv, needle):
    tiny_llama(tmp_path, heads, kv, False)
    with pytest.raises(LayoutError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        shard(tmp_path / "hf", tmp_path / "nxd", Layout(**kwargs))
    assert not (tmp_path / "nxd").exists()


def test_sharded_safetensors_and_bin_inputs_give_the_same_shards(tmp_path):
    model = tiny_llama(tmp_path, 8, 2, False)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    (tmp_path / "multi").mkdir()
    (tmp_path / "bin").mkdir()
    names = sorted(sd)
    halves = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
    for f, keys in halves.items():
        save_file({k: sd[k] for k in keys}, tmp_path / "multi" / f)
    (tmp_path / "multi/model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {k: f for f, ks in halves.items() for k in ks}})
    )
    torch.save(sd, tmp_path / "bin/pytorch_model.bin")
    for d in ("multi", "bin"):
        (tmp_path / d / "config.json").write_text((tmp_path / "hf/config.json").read_text())
    layout = Layout(tp=4, pp=2, kv_size_multiplier=2, qkv_linear=True)
    for d in ("hf", "multi", "bin"):
        shard(tmp_path / d, tmp_path / f"nxd-{d}", layout)
    for t in range(4):
        for p in range(2):
            ref = rank_state(tmp_path / "nxd-hf", t, p)
            for d in ("multi", "bin"):
                other = rank_state(tmp_path / f"nxd-{d}", t, p)
                assert sorted(other) == sorted(ref) and all(torch.equal(other[k], ref[k]) for k in ref)


def test_reader_slices_equal_safetensors(tmp_path):
    t = torch.randn(37, 300).to(torch.bfloat16)
    save_file({"w": t, "s": torch.tensor(3.5)}, tmp_path / "x.safetensors")
    hf = HFCheckpoint(tmp_path)
    assert torch.equal(hf.rows("w", 5, 20), t[5:20]) and torch.equal(hf.cols("w", 100, 190), t[:, 100:190])
    assert torch.equal(hf.full("s"), torch.tensor(3.5))


def test_checkpoint_that_is_not_a_llama_is_refused(tmp_path):
    model = tiny_llama(tmp_path, 8, 2, False)
    sd = dict(model.state_dict())
    sd["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(32)
    del sd["model.layers.1.mlp.up_proj.weight"]
    save_file({k: v.contiguous() for k, v in sd.items()}, tmp_path / "hf/model.safetensors")
    with pytest.raises(
        ValueError,
        match=r"missing \['model.layers.1.mlp.up_proj.weight'\].*unexpected \['model.layers.0.self_attn.q_proj.bias'\]",
    ):
        shard(tmp_path / "hf", tmp_path / "nxd", Layout(tp=2))
