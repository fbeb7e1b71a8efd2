"""Document masking (train.document_masking): no token attends across a document boundary inside a
packed row, and positions restart per document (llmpipe.train.documents)."""

import json

import pytest
import torch

from llmpipe.train.documents import FLEX, SDPA, document_block_mask, document_mask, document_positions, model_inputs
from tests.test_train_torch import losses, run_train

# fp32 on CPU: the same document's logits alone or after another one differ only by summation order
# inside SDPA's kernels (measured ~6e-8); without the mask they differ by ~0.1-1.
ATOL = 1e-5


def tiny_llama(seed=0, attention=SDPA):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM._from_config(cfg, attn_implementation=attention).eval()


def test_positions_restart_and_mask_is_block_diagonal_causal():
    seg = torch.tensor([[0, 0, 0, 1, 1, 2, -1, -1]])
    assert document_positions(seg).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1]]
    m = document_mask(seg)[0, 0]
    assert m.shape == (8, 8)
    for i in range(8):
        for j in range(8):
            assert bool(m[i, j]) == (j <= i and seg[0, i] == seg[0, j]), (i, j)
    # a document of one token between two others: its own segment
    assert document_positions(torch.tensor([[0, 0, 1, 2, 2]])).tolist() == [[0, 1, 0, 0, 1]]


@pytest.mark.parametrize("first_len", [1, 10, 30])
def test_document_logits_do_not_depend_on_the_document_before_it(first_len):
    model, cpu = tiny_llama(), torch.device("cpu")
    g = torch.Generator().manual_seed(first_len)
    a, b = torch.randint(0, 128, (first_len,), generator=g), torch.randint(0, 128, (20,), generator=g)
    length = first_len + 20
    packed = {"input_ids": torch.cat([a, b])[None], "segment_ids": torch.tensor([[0] * first_len + [1] * 20])}
    alone = {  # b at the row start, padding after it (as the view pads a row's tail)
        "input_ids": torch.cat([b, torch.zeros(first_len, dtype=torch.long)])[None],
        "segment_ids": torch.tensor([[0] * 20 + [-1] * first_len]),
    }
    with torch.no_grad():
        in_row = model(**model_inputs(packed, cpu, True)).logits[0, first_len:]
        by_itself = model(**model_inputs(alone, cpu, True)).logits[0, :20]
        unmasked = model(**model_inputs(packed, cpu, False)).logits[0, first_len:]
    assert in_row.shape == (20, 128) and length == packed["input_ids"].shape[1]
    torch.testing.assert_close(in_row, by_itself, atol=ATOL, rtol=0)
    assert (unmasked - by_itself).abs().max() > 1e-2  # without masking, b sees a: the test can fail


def packed_rows(lengths: list[list[int]], length: int) -> torch.Tensor:
    """[rows, length] segment ids of rows holding documents of these lengths, -1 (padding) after them."""
    rows = []
    for docs in lengths:
        seg = torch.repeat_interleave(torch.arange(len(docs)), torch.tensor(docs))
        rows.append(torch.cat([seg, torch.full((length - len(seg),), -1)]))
    return torch.stack(rows)


# 300 positions = 3 tiles of 128 in flex_attention's BlockMask: empty, partial and full tiles; a one-token
# document; padding at a row's end.
ROWS = [[100, 1, 90, 70], [270, 20], [300]]


def test_block_mask_is_the_dense_document_mask():
    """flex_attention's BlockMask (used on CUDA) holds document_mask's rule: its mask_mod over every
    (query, key) is document_mask, and a 128 x 128 tile is listed exactly where that tile of
    document_mask has an allowed pair. On CUDA the builder is compiled: here too where inductor works."""
    from torch.nn.attention.flex_attention import create_mask

    from llmpipe.train import documents
    from tests.test_torch_compile import inductor_works

    seg = packed_rows(ROWS, 300)
    dense = document_mask(seg)
    block = document_block_mask(seg)
    assert torch.equal(create_mask(block.mask_mod, 3, 1, 300, 300, device="cpu"), dense)
    tiles = torch.nn.functional.pad(dense, (0, 84, 0, 84)).reshape(3, 1, 3, 128, 3, 128)
    assert torch.equal(block.to_dense().bool(), tiles.any(5).any(3))
    assert int(block.full_kv_num_blocks.sum()) > 0  # full tiles (mask_mod skipped) are exercised
    if inductor_works() is None:
        compiled = documents._compiled_create_block_mask()(block.mask_mod, 3, None, 300, 300, device="cpu")
        assert torch.equal(compiled.to_dense(), block.to_dense())
        assert torch.equal(compiled.full_kv_num_blocks, block.full_kv_num_blocks)


def test_flex_attention_logits_equal_the_dense_mask_path():
    """The CUDA path (flex_attention + BlockMask) gives the CPU path's logits (SDPA + dense mask) for rows
    of several documents and padding, with the same per-document positions. flex_attention runs forward
    only on CPU (no backward there): transformers compiles it (inductor), so it needs a C++ compiler."""
    from tests.test_torch_compile import inductor_works

    if reason := inductor_works():
        pytest.skip(reason)
    sdpa, flex = tiny_llama(attention=SDPA), tiny_llama(attention=FLEX)
    flex.load_state_dict(sdpa.state_dict())
    seg = packed_rows(ROWS, 300)
    batch = {"input_ids": torch.randint(0, 128, seg.shape, generator=torch.Generator().manual_seed(0)), "segment_ids": seg}
    cpu = torch.device("cpu")
    dense_in, flex_in = model_inputs(batch, cpu, True, SDPA), model_inputs(batch, cpu, True, FLEX)
    assert torch.equal(flex_in["position_ids"], dense_in["position_ids"])
    with torch.no_grad():
        want = sdpa(**dense_in).logits
        got = flex(**flex_in).logits
        unmasked = sdpa(**model_inputs(batch, cpu, False)).logits
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    assert (unmasked - want).abs().max() > 1e-2  # the masks matter here: the comparison can fail


def first_step_with_a_boundary(prepared, steps):
    """The first step (0-based) whose global batch holds a row with more than one document."""
    import datasets
    import numpy as np

    from llmpipe.train.batching import Sampler

    t = prepared["cfg"]["train"]
    seg = np.array(datasets.load_from_disk(str(prepared["view"] / "train"))["segment_ids"])
    sampler = Sampler(len(seg), t["seed"])
    return next(s for s in range(steps) if (seg[sampler.global_batch(s, t["global_batch_size"])].max(1) > 0).any())


def test_trainer_masks_documents_by_default_and_not_when_off(prepared, tmp_path):
    """The view carries segment_ids: auto trains masked; false attends across documents. Steps whose rows
    hold one document each train the same either way; the first with a boundary inside a row differs."""
    steps = {"max_steps": 4, "eval_interval": 4}
    on, proc = run_train(prepared, tmp_path, "on", cfg_over={"train": steps})
    assert "document masking on" in proc.stderr
    off, proc = run_train(prepared, tmp_path, "off", cfg_over={"train": {**steps, "document_masking": False}})
    assert "document masking off" in proc.stderr
    a, b = losses(on), losses(off)
    first = first_step_with_a_boundary(prepared, 4)
    for s in range(first):
        assert a[s]["loss"] == pytest.approx(b[s]["loss"], abs=1e-6), s
    assert a[first]["loss"] != pytest.approx(b[first]["loss"], abs=1e-6)
    assert a[-1]["val_loss"] != b[-1]["val_loss"]  # validation is masked too (val rows hold boundaries)
    assert json.loads((on / "final" / "train_summary.json").read_text())["document_masking"] is True
    assert json.loads((off / "final" / "train_summary.json").read_text())["document_masking"] is False


def test_evaluate_scores_documents_as_the_trainer_does(prepared, tmp_path):
    """`llmpipe evaluate` follows train.document_masking (auto: on with segment_ids) and records it; the
    masked loss equals dataset_loss with masking, the unmasked one differs (rows hold several documents)."""
    import datasets
    from transformers import AutoModelForCausalLM

    from llmpipe.evaluate import evaluate
    from llmpipe.train.loss import dataset_loss

    on = evaluate(prepared["init"], prepared["view"], tmp_path / "on.json", 4, 1)
    off = evaluate(prepared["init"], prepared["view"], tmp_path / "off.json", 4, 1, document_masking=False)
    assert on["document_masking"] is True and off["document_masking"] is False
    assert abs(on["val_loss"] - off["val_loss"]) > 1e-5  # a random init model: context moves the loss a little (5e-5)
    model = AutoModelForCausalLM.from_pretrained(str(prepared["init"]), dtype=torch.float32, attn_implementation="sdpa")
    val = datasets.load_from_disk(str(prepared["view"] / "val")).with_format("torch")
    want, _ = dataset_loss(model, val, 4, torch.device("cpu"), document_masking=True)
    assert abs(on["val_loss"] - want) < 1e-7
    plain = tmp_path / "no-seg"
    datasets.load_from_disk(str(prepared["view"] / "val")).remove_columns("segment_ids").save_to_disk(str(plain / "val"))
    (plain / "view.json").write_text((prepared["view"] / "view.json").read_text())
    assert evaluate(prepared["init"], plain, tmp_path / "p.json", 4, 1)["document_masking"] is False  # auto: off
    with pytest.raises(SystemExit, match="segment_ids"):
        evaluate(prepared["init"], tmp_path / "no-seg", tmp_path / "x.json", 4, 1, document_masking=True)
