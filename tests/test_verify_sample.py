"""verify's re-tokenized sample: each source read at most once for all the shards (real gzip source, real
GPT-2 tokenizer, real tokenize jobs), and a changed stored token in the sample is still named."""

from __future__ import annotations

import gzip
import json
import struct

import numpy as np
import pytest

from llmpipe.data import verify_store
from llmpipe.data.get_data import get_data, load_sources
from llmpipe.data.token_store import TokenStore, build_manifest
from llmpipe.data.tokenize import tokenize_shard
from llmpipe.data.tokenizer import copy_tokenizer
from llmpipe.data.verify_store import VerifyError, check_tokenization
from tests.conftest import GPT2, corpus_docs, tiny_config

SHARDS = 16


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sample")
    with gzip.open(tmp / "corpus.jsonl.gz", "wt") as fh:
        fh.writelines(json.dumps({"text": t}) + "\n" for t in corpus_docs(200))
    cfg = tiny_config(tmp, data={"sources": [str(tmp / "corpus.jsonl.gz")], "num_shards": SHARDS, "val_fraction": 0.1})
    key = get_data(cfg["data"], tmp / "sources.json")["key"]
    sources = load_sources(tmp / "sources.json")
    copy_tokenizer(str(GPT2), tmp / "tok")
    outs = [tmp / "tokens" / f"shard-{i:05d}.safetensors" for i in range(SHARDS)]
    for i, out in enumerate(outs):
        tokenize_shard(cfg, sources, i, tmp / "tok", out, sources_key=key)
    build_manifest(outs, tmp / "tokens" / "manifest.json", key)
    return {"tmp": tmp, "cfg": cfg, "sources": sources, "store": TokenStore(tmp / "tokens" / "manifest.json")}


def counting(monkeypatch) -> list:
    calls = []
    real = verify_store.documents

    def documents(source, *args, **kwargs):
        calls.append(str(source))
        return real(source, *args, **kwargs)

    monkeypatch.setattr(verify_store, "documents", documents)
    return calls


@pytest.mark.parametrize("sample, want", [(4, 4 * SHARDS), (1000, 200)])
def test_one_read_for_all_shards(store, monkeypatch, sample, want):
    """One source dealt across 16 shards: one read of it (it was one per shard: 16 reads, each of the whole
    file once a shard holds fewer documents than the sample), and every shard's sample checked."""
    calls = counting(monkeypatch)
    got = check_tokenization(store["store"], store["tmp"] / "tok", store["cfg"]["data"], store["sources"], sample)
    assert got == {"documents_retokenized": want}
    assert len(calls) == 1, calls


def test_a_changed_token_in_the_sample_is_named(store, tmp_path, monkeypatch):
    import shutil

    tokens = tmp_path / "tokens"
    shutil.copytree(store["tmp"] / "tokens", tokens)
    shard = tokens / "shard-00005.safetensors"
    with open(shard, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    entry = header["train.tokens"]
    dtype = np.dtype({"U16": "<u2", "U32": "<u4", "I32": "<i4"}[entry["dtype"]])
    at = 8 + n + entry["data_offsets"][0] + 2 * dtype.itemsize  # the first document's third token
    with open(shard, "r+b") as fh:
        fh.seek(at)
        old = int(np.frombuffer(fh.read(dtype.itemsize), dtype)[0])
        fh.seek(at)
        fh.write(np.asarray([old + 1], dtype).tobytes())
    ts = TokenStore(tokens / "manifest.json")
    with pytest.raises(VerifyError, match=r"shard 5, .*shard-00005.safetensors\): stored ids differ"):
        check_tokenization(ts, store["tmp"] / "tok", store["cfg"]["data"], store["sources"], 2)
