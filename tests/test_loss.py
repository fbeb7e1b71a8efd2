"""The loss (llmpipe.train.loss): chunked float32 cross-entropy equals F.cross_entropy on the float32
logits, loss and gradients, and never makes a float32 copy of the whole logits; its compiled chunks
(train.compile) give the eager ones' loss and gradients, one graph for equal chunks."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from llmpipe.data.pack import IGNORE_INDEX
from llmpipe.train import cross_entropy
from llmpipe.train.loss import lm_loss_sum, logits_loss_sum

VOCAB = 97


def tiny_llama(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa")


def batch(rows=3, seq=19, seed=1):
    """Random ids; labels = ids with random positions and a padded row end set to IGNORE_INDEX."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (rows, seq), generator=gen)
    labels = ids.clone()
    labels[torch.rand(rows, seq, generator=gen) < 0.2] = IGNORE_INDEX
    labels[-1, -5:] = IGNORE_INDEX
    return ids, labels


def plain_loss_sum(logits, labels):
    """The loss before chunking: F.cross_entropy of the shifted logits upcast to float32."""
    flat, target = logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)
    return F.cross_entropy(flat, target, ignore_index=IGNORE_INDEX, reduction="sum")


def test_chunked_loss_and_gradients_equal_plain_cross_entropy(monkeypatch):
    # up to 11 positions a chunk: 57 (3 x 19) has no divisor from 11 down to 6, so 6 chunks, the last of 2
    monkeypatch.setattr(cross_entropy, "CHUNK_ELEMENTS", 11 * VOCAB)
    ids, labels = batch()
    model = tiny_llama()
    loss, count = lm_loss_sum(model, ids, labels)
    loss.backward()
    chunked = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    plain = plain_loss_sum(model(input_ids=ids).logits, labels)
    plain.backward()

    assert int(count) == int((labels[:, 1:] != IGNORE_INDEX).sum())
    assert abs(loss.item() - plain.item()) / int(count) < 1e-6
    for name, p in model.named_parameters():  # equal up to float32 rounding, relative to the tensor's scale
        scale = p.grad.abs().max().item()
        torch.testing.assert_close(chunked[name], p.grad, rtol=1e-5, atol=1e-6 * scale, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logit_gradients_equal_plain_and_ignored_positions_get_none(dtype):
    ids, labels = batch(seed=2)
    logits = (torch.randn(*ids.shape, VOCAB, generator=torch.Generator().manual_seed(3)) * 4).to(dtype)
    grads, sums = [], []
    for fn in (lambda x: logits_loss_sum(x, labels)[0], lambda x: plain_loss_sum(x, labels)):
        x = logits.clone().requires_grad_()
        out = fn(x)
        (out * 0.37).backward()  # a scaled loss, as the trainers back-propagate it
        grads.append(x.grad)
        sums.append(out.item())
    assert grads[0].dtype == dtype
    assert abs(sums[0] - sums[1]) <= 1e-6 * abs(sums[1])
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-7)
    ignored = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)], 1) == IGNORE_INDEX
    assert ignored.any() and not grads[0][ignored].any()


class Float32Sizes(TorchDispatchMode):
    """The element counts of every float32 tensor an op makes."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                self.sizes.append(t.numel())
        return out


def test_no_float32_tensor_of_the_whole_logits(monkeypatch):
    chunk_rows = 4
    monkeypatch.setattr(cross_entropy, "CHUNK_ELEMENTS", chunk_rows * VOCAB)
    ids, labels = batch(rows=4, seq=32)
    logits = torch.randn(*ids.shape, VOCAB, dtype=torch.bfloat16)
    whole = (ids.shape[1] - 1) * ids.shape[0] * VOCAB
    seen = {}
    for name, fn in (("chunked", lambda x: logits_loss_sum(x, labels)[0]), ("plain", lambda x: plain_loss_sum(x, labels))):
        x = logits.clone().requires_grad_()
        with Float32Sizes() as sizes:
            fn(x).backward()
        seen[name] = max(sizes.sizes)
    assert seen["plain"] >= whole  # the check sees what the old loss made
    assert seen["chunked"] <= chunk_rows * VOCAB


def test_chunks_are_equal_where_a_divisor_is_near_the_budget():
    rows_for = cross_entropy.chunk_rows_for
    assert rows_for(4 * 4096, 2**25 // 32000) == 1024  # 1.1B at seq 4096, micro 4: 16 equal chunks, not 15 + 1
    assert rows_for(57, 5) == 3 and rows_for(57, 11) == 11 and rows_for(53, 5) == 5  # 53 is prime
    assert rows_for(40, 64) == 40 and rows_for(1, 1) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_chunks_give_the_eager_loss_and_gradients(dtype, monkeypatch):
    """`compiled` (the torch trainer under train.compile): each chunk through torch.compile. Same loss and
    logit gradients as eager; equal chunks compile one forward and one backward graph, and a second call
    compiles nothing (torch._dynamo's error_on_recompile)."""
    from torch._dynamo.utils import counters

    from tests.test_torch_compile import inductor_works

    if reason := inductor_works():
        pytest.skip(reason)
    monkeypatch.setattr(cross_entropy, "CHUNK_ELEMENTS", 8 * VOCAB)
    ids, labels = batch(rows=4, seq=16, seed=4)  # 64 positions: 8 chunks of 8
    logits = (torch.randn(*ids.shape, VOCAB, generator=torch.Generator().manual_seed(5)) * 4).to(dtype)
    got = {}
    torch._dynamo.reset()
    counters.clear()
    try:
        for compiled in (False, True):
            for call in range(2):
                x = logits.clone().requires_grad_()
                with torch._dynamo.config.patch(error_on_recompile=call == 1):
                    out = logits_loss_sum(x, labels, compiled=compiled)[0]
                    (out * 0.37).backward()
                got[compiled] = (out.item(), x.grad)
                if compiled:
                    assert counters["frames"]["ok"] == counters["frames"]["total"] == 2, dict(counters["frames"])
    finally:
        torch._dynamo.reset()
    assert got[True][0] == pytest.approx(got[False][0], rel=1e-6)
    assert got[True][1].dtype == dtype
    torch.testing.assert_close(got[True][1], got[False][1], rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-7)
