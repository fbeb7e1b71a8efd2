"""get_data shards, tokenize (scatter), token store (gather), hf view."""

import json

import datasets
import numpy as np
import pyarrow.parquet as pq
import pytest
from safetensors import safe_open

from llmpipe.data.get_data import get_data
from llmpipe.data.pack import IGNORE_INDEX
from llmpipe.data.token_store import TokenStore, build_manifest
from llmpipe.data.tokenize import tokenize_shard
from llmpipe.data.tokenizer import copy_tokenizer, load_tokenizer, tokenizer_info
from tests.conftest import GPT2, SHARED_DATA, corpus_docs, tiny_config, write_jsonl


def read_shards(raw):
    rows = []
    for f in sorted(raw.glob("shard-*.parquet")):
        rows += pq.read_table(f).to_pylist()
    return rows


def test_every_document_lands_in_exactly_one_shard(prepared):
    docs = [json.loads(line)["text"] for line in (prepared["root"] / "corpus.jsonl").read_text().splitlines()]
    rows = read_shards(prepared["raw"])
    assert sorted(r["doc_id"] for r in rows) == list(range(len(docs)))
    assert all(r["text"] == docs[r["doc_id"]] for r in rows)
    splits = {r["split"] for r in rows}
    assert splits == {"train", "val"}
    manifest = json.loads((prepared["raw"] / "manifest.json").read_text())
    assert manifest["documents"]["train"] + manifest["documents"]["val"] == len(docs)


def test_validation_split_does_not_depend_on_shard_count(tmp_path, prepared):
    cfg = tiny_config(prepared["root"], data={"num_shards": 5})
    get_data(cfg["data"], tmp_path)
    a = {r["doc_id"]: r["split"] for r in read_shards(prepared["raw"])}
    b = {r["doc_id"]: r["split"] for r in read_shards(tmp_path)}
    assert a == b
    assert len(list(tmp_path.glob("shard-*.parquet"))) == 5


def test_empty_validation_split_is_an_error(tmp_path):
    write_jsonl(tmp_path / "corpus.jsonl", corpus_docs(2))
    cfg = tiny_config(tmp_path, data={"val_fraction": 1e-9})
    with pytest.raises(ValueError, match="validation documents"):
        get_data(cfg["data"], tmp_path / "raw")
    assert not list((tmp_path / "raw").glob("shard-*"))  # nothing that looks complete


def test_token_shards_hold_each_document_plus_eos(prepared):
    tok = load_tokenizer(prepared["tokenizer"])
    eos = tok.eos_token_id
    texts = {r["doc_id"]: r["text"] for r in read_shards(prepared["raw"])}
    for f in sorted(prepared["tokens"].glob("shard-*.safetensors")):
        with safe_open(str(f), framework="numpy") as st:
            for split in ("train", "val"):
                toks, offs, ids = (st.get_tensor(f"{split}.{k}") for k in ("tokens", "offsets", "doc_ids"))
                assert offs[0] == 0 and offs[-1] == toks.size and len(offs) == len(ids) + 1
                for i, doc_id in enumerate(ids):
                    expected = tok(texts[int(doc_id)], add_special_tokens=False)["input_ids"] + [eos]
                    assert toks[offs[i] : offs[i + 1]].tolist() == expected


def test_manifest_totals_match_shards(prepared):
    store = TokenStore(prepared["tokens"] / "manifest.json")
    for split in ("train", "val"):
        stream = store.tokens(split)
        assert stream.size == store.manifest["totals"][split]["tokens"]
        assert stream[-1] == store.eos_id


def test_store_refuses_shards_from_two_tokenizers(tmp_path, prepared):
    raw = sorted(prepared["raw"].glob("shard-*.parquet"))
    copy_tokenizer(GPT2, tmp_path / "gpt2")
    a, b = tmp_path / "shard-00000.safetensors", tmp_path / "shard-00001.safetensors"
    tokenize_shard(raw[0], prepared["tokenizer"], a)
    tokenize_shard(raw[1], tmp_path / "gpt2", b)
    with pytest.raises(ValueError, match="different tokenizer"):
        build_manifest([a, b], tmp_path / "manifest.json")


def test_gpt2_adds_no_bos_and_ids_match_hf(tmp_path, prepared):
    raw = sorted(prepared["raw"].glob("shard-*.parquet"))[0]
    copy_tokenizer(GPT2, tmp_path / "gpt2")
    info = tokenizer_info(tmp_path / "gpt2")
    assert (info.eos_id, info.adds_bos) == (50256, False)
    tokenize_shard(raw, tmp_path / "gpt2", tmp_path / "s.safetensors")
    with safe_open(str(tmp_path / "s.safetensors"), framework="numpy") as st:
        toks = st.get_tensor("train.tokens")
    assert toks.dtype == np.uint16
    first = pq.read_table(raw).to_pylist()
    first_train = next(r for r in first if r["split"] == "train")
    expected = load_tokenizer(tmp_path / "gpt2")(first_train["text"])["input_ids"]
    assert toks[: len(expected)].tolist() == expected and toks[len(expected)] == 50256


@pytest.mark.skipif(not (SHARED_DATA / "tokenizers" / "llama3").is_dir(), reason="needs ../shared/data/tokenizers/llama3")
def test_llama3_auto_bos(tmp_path, prepared):
    raw = sorted(prepared["raw"].glob("shard-*.parquet"))[0]
    copy_tokenizer(SHARED_DATA / "tokenizers" / "llama3", tmp_path / "llama3")
    info = tokenizer_info(tmp_path / "llama3")
    assert info.adds_bos and info.bos_id == 128000 and info.eos_id == 128001
    tokenize_shard(raw, tmp_path / "llama3", tmp_path / "s.safetensors", add_bos="auto")
    with safe_open(str(tmp_path / "s.safetensors"), framework="numpy") as st:
        toks, offs = st.get_tensor("train.tokens"), st.get_tensor("train.offsets")
    assert toks.dtype == np.uint32
    assert (toks[offs[:-1]] == 128000).all() and (toks[offs[1:] - 1] == 128001).all()


def test_hf_view_rows_and_conservation(prepared):
    view = prepared["view"]
    seq = prepared["cfg"]["train"]["seq_len"]
    stats = json.loads((view / "view.json").read_text())
    store = TokenStore(prepared["tokens"] / "manifest.json")
    for split in ("train", "val"):
        ds = datasets.load_from_disk(str(view / split)).with_format("numpy")[:]
        ids, mask, labels = ds["input_ids"], ds["attention_mask"], ds["labels"]
        assert ids.shape[1] == seq and mask.shape == ids.shape == labels.shape
        stream = store.tokens(split)
        kept = ids[mask == 1]
        assert kept.tolist() == stream[: kept.size].tolist()
        assert (labels[mask == 0] == IGNORE_INDEX).all() and (labels[mask == 1] == ids[mask == 1]).all()
        s = stats[split]
        assert s["tokens_packed"] + s["dropped_tokens"] == stream.size
    assert stats["val"]["dropped_tokens"] == 0  # val is padded, not dropped
