"""SplitStream reads the store through memory maps (stfile.memmap): every range, empty shards among them,
equals the shards' tokens read by the safetensors library itself."""

from __future__ import annotations

import numpy as np
from safetensors.numpy import load_file

from llmpipe.data.token_store import TokenStore
from tests.conftest import GPT2, corpus_docs, prepare, tiny_config, write_jsonl


def test_every_range_equals_the_shards_read_by_safetensors(tmp_path):
    write_jsonl(tmp_path / "corpus.jsonl", corpus_docs(4))
    cfg = tiny_config(tmp_path, data={"num_shards": 7, "val_fraction": 0.01}, tokenizer={"source": str(GPT2)})
    out = prepare(tmp_path, cfg, views=())
    store = TokenStore(out["manifest"])
    files = [store.root / e["file"] for e in store.manifest["shards"]]
    shards = [load_file(str(f))["train.tokens"] for f in files]
    assert any(s.size == 0 for s in shards) and sum(s.size > 0 for s in shards) >= 2  # empty shards between full ones
    want = np.concatenate(shards)
    stream = store.split("train")
    assert stream.size == want.size and stream.dtype == want.dtype
    cuts = sorted({0, want.size, *np.cumsum([s.size for s in shards]).tolist(), *range(0, want.size, max(1, want.size // 9))})
    for a in cuts:
        for b in cuts:
            if a <= b:
                assert np.array_equal(stream.view(a, b), want[a:b]), (a, b)
                got = stream.read(a, b)
                assert got.dtype == np.int64 and np.array_equal(got, want[a:b].astype(np.int64))
    starts = np.concatenate([[0], np.cumsum([s.size for s in shards])])
    offsets = [load_file(str(f))["train.offsets"] for f in files]
    assert np.array_equal(stream.doc_starts(), np.concatenate([o[:-1] + s for o, s in zip(offsets, starts)]))
