"""G4: the strided scan of a large plain JSONL (fewer sources than shards) leaves the token store and views
byte for byte as the line-by-line read makes them (readers.STRIDED_SCAN = False, the reference path), and
every shard holds exactly the documents a plain single-process read assigns it (record index % num_shards)."""

import hashlib
import json

import numpy as np
import pytest
from safetensors import safe_open

from llmpipe.data.readers import jsonl, limits
from llmpipe.data.sources import doc_id, is_validation
from tests.conftest import GPT2, corpus_docs, prepare, tiny_config

SHARDS = 5  # > the 2 sources, >= readers.STRIDE_MIN


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Two plain JSONL sources: a large-ish one (paragraphs of the shipped sample, with blank and CRLF
    lines, ~1.8 MB) and a small one."""
    root = tmp_path_factory.mktemp("identity-data")
    paras = [p for d in corpus_docs(400) for p in d.split("\n\n") if p.strip()]
    lines = []
    for i, p in enumerate(paras):
        lines.append(json.dumps({"text": p}).encode() + (b"\r\n" if 3000 <= i < 3100 else b"\n"))
        if i % 97 == 0:
            lines.append(b"   \n")  # blank: not a record
    (root / "big.jsonl").write_bytes(b"".join(lines))
    (root / "small.jsonl").write_bytes(b"".join(json.dumps({"text": p}).encode() + b"\n" for p in paras[:30]))
    return root


def run(tmp, corpus, strided: bool, monkeypatch) -> dict:
    monkeypatch.setattr(limits, "STRIDED_SCAN", strided)
    monkeypatch.setattr(limits, "STRIDE_BLOCK", 1 << 16)  # many blocks, block ends inside records
    cfg = tiny_config(
        tmp,
        data={"sources": [str(corpus / "big.jsonl"), str(corpus / "small.jsonl")], "num_shards": SHARDS},
        tokenizer={"source": str(GPT2)},
    )
    out = prepare(tmp, cfg, views=("hf",))
    files = sorted(p for d in (out["tokens"], out["view"]) for p in d.rglob("*") if p.is_file())
    return {str(p.relative_to(tmp)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}, out


def test_strided_scan_gives_byte_identical_store_and_views(tmp_path, corpus, monkeypatch):
    calls = []
    scan = jsonl._strided_lines
    monkeypatch.setattr(jsonl, "_strided_lines", lambda *a: calls.append(a[2]) or scan(*a))
    new, out = run(tmp_path / "strided", corpus, True, monkeypatch)
    assert calls, "the strided scan was not used"
    calls.clear()
    ref, _ = run(tmp_path / "reference", corpus, False, monkeypatch)
    assert not calls
    assert any(k.endswith(".safetensors") for k in new) and any(k.startswith("hf/") for k in new)
    assert new == ref  # every shard, manifest.json, every file of the hf view

    # independent of both paths: a plain read of every record, in order, dealt by record index % shards
    d = out["cfg"]["data"]
    want = {(s, split): [] for s in range(SHARDS) for split in ("train", "val")}
    for s_idx, name in enumerate(("big.jsonl", "small.jsonl")):
        records = [json.loads(line) for line in (corpus / name).read_bytes().splitlines() if line.strip()]
        for r_idx, _ in enumerate(records):
            split = "val" if is_validation(s_idx, r_idx, d["val_fraction"], d["split_seed"]) else "train"
            want[(r_idx % SHARDS, split)].append(doc_id(s_idx, r_idx))
    for s in range(SHARDS):
        with safe_open(str(out["tokens"] / f"shard-{s:05d}.safetensors"), framework="numpy") as f:
            for split in ("train", "val"):
                assert np.array_equal(f.get_tensor(f"{split}.doc_ids"), np.array(want[(s, split)], np.int64)), (s, split)
