import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmpipe.data.pack import IGNORE_INDEX, Layout, order, pack, row

EOS = 0


def stream_of(docs):
    return np.concatenate([np.asarray(d + [EOS], dtype=np.int64) for d in docs])


docs_strategy = st.lists(st.lists(st.integers(1, 999), min_size=0, max_size=40), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(docs=docs_strategy, seq_len=st.integers(2, 50), remainder=st.sampled_from(["drop", "pad", "carry"]))
def test_packing_conserves_every_token_in_order(docs, seq_len, remainder):
    stream = stream_of(docs)
    if remainder == "carry" and stream.size < seq_len:
        with pytest.raises(ValueError, match="carry"):
            pack(stream, seq_len, remainder, pad_id=EOS)
        return
    p = pack(stream, seq_len, remainder, pad_id=EOS)
    assert p.input_ids.shape == p.labels.shape == p.attention_mask.shape
    assert p.input_ids.shape[1] == seq_len
    real = p.input_ids[p.attention_mask == 1]
    rest = stream.size % seq_len
    # packed stream == concatenation of (doc tokens + EOS), in order, remainder as the policy says
    if remainder == "drop":
        assert real.tolist() == stream[: stream.size - rest].tolist()
        assert p.stats["dropped_tokens"] == rest
    elif remainder == "pad":
        assert real.tolist() == stream.tolist()
        assert p.stats["padded_tokens"] == (seq_len - rest if rest else 0)
        assert (p.input_ids[p.attention_mask == 0] == EOS).all()
    else:
        wrap = (seq_len - rest) % seq_len
        assert real.tolist() == stream.tolist() + stream[:wrap].tolist()
        assert p.stats["wrapped_tokens"] == wrap and (p.attention_mask == 1).all()
    assert (p.labels[p.attention_mask == 0] == IGNORE_INDEX).all()
    assert (p.labels[p.attention_mask == 1] == p.input_ids[p.attention_mask == 1]).all()
    assert p.stats["tokens_packed"] + p.stats["dropped_tokens"] == stream.size


def test_eos_separates_every_document():
    p = pack(stream_of([[5, 6], [7], [8, 9, 10]]), 4, "pad", pad_id=EOS)
    assert p.input_ids.tolist() == [[5, 6, 0, 7], [0, 8, 9, 10], [0, 0, 0, 0]]
    assert p.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert p.labels[2].tolist() == [0, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]


def test_segment_ids_follow_document_starts_including_wrap():
    stream = stream_of([[5, 6], [7], [8, 9, 10]])  # 5 6 0 | 7 0 | 8 9 10 0  (9 tokens)
    starts = np.array([0, 3, 5])
    layout = Layout(stream.size, 4, "carry")
    segs = [row(lambda a, b: stream[a:b], layout, i, EOS, starts)[2].tolist() for i in range(layout.rows)]
    assert segs == [[0, 0, 0, 1], [0, 1, 1, 1], [0, 1, 1, 1]]  # last row: "0" then wrapped "5 6 0"
    layout = Layout(stream.size, 4, "pad")
    assert row(lambda a, b: stream[a:b], layout, 2, EOS, starts)[2].tolist() == [0, -1, -1, -1]


def test_order_is_a_seeded_permutation():
    a, b = order(100, True, 3), order(100, True, 3)
    assert a.tolist() == b.tolist() and sorted(a.tolist()) == list(range(100)) and a.tolist() != list(range(100))
    assert order(5, False, 3).tolist() == [0, 1, 2, 3, 4]


def test_unknown_policy():
    with pytest.raises(ValueError, match="remainder"):
        pack(np.arange(10), 4, "carry-on", pad_id=0)
