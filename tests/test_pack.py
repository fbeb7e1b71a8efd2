import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmpipe.data.pack import IGNORE_INDEX, pack

EOS = 0


def stream_of(docs):
    return np.concatenate([np.asarray(d + [EOS], dtype=np.uint32) for d in docs])


docs_strategy = st.lists(st.lists(st.integers(1, 999), min_size=0, max_size=40), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(docs=docs_strategy, seq_len=st.integers(2, 50), remainder=st.sampled_from(["drop", "pad"]))
def test_packing_conserves_every_token_in_order(docs, seq_len, remainder):
    stream = stream_of(docs)
    p = pack(stream, seq_len, remainder, pad_id=EOS)
    assert p.input_ids.shape == p.labels.shape == p.attention_mask.shape
    assert p.input_ids.shape[1] == seq_len
    real = p.input_ids[p.attention_mask == 1]
    # packed stream == concatenation of (doc tokens + EOS), in order, minus what the policy says
    rest = stream.size % seq_len
    if remainder == "drop":
        assert real.tolist() == stream[: stream.size - rest].tolist()
        assert p.stats["dropped_tokens"] == rest and p.stats["padded_tokens"] == 0
        assert (p.attention_mask == 1).all()
    else:
        assert real.tolist() == stream.tolist()
        assert p.stats["dropped_tokens"] == 0
        assert p.stats["padded_tokens"] == (seq_len - rest if rest else 0)
        assert (p.input_ids[p.attention_mask == 0] == EOS).all()
    assert (p.labels[p.attention_mask == 0] == IGNORE_INDEX).all()
    assert (p.labels[p.attention_mask == 1] == p.input_ids[p.attention_mask == 1]).all()
    assert p.stats["tokens_packed"] + p.stats["dropped_tokens"] == stream.size


def test_eos_separates_every_document():
    p = pack(stream_of([[5, 6], [7], [8, 9, 10]]), 4, "pad", pad_id=EOS)
    assert p.input_ids.tolist() == [[5, 6, 0, 7], [0, 8, 9, 10], [0, 0, 0, 0]]
    assert p.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert p.labels[2].tolist() == [0, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]


def test_unknown_policy():
    with pytest.raises(ValueError, match="remainder"):
        pack(np.arange(10), 4, "carry-on", pad_id=0)
