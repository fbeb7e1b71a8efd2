"""Token store and views on real data; the reference is an independent re-tokenization / re-parse."""

import json
import struct

import datasets
import numpy as np
import pytest
from safetensors import safe_open

from llmpipe.data.encoders import make_encoder
from llmpipe.data.pack_views import build_view
from llmpipe.data.token_store import TokenStore, build_manifest
from llmpipe.data.tokenize import tokenize_shard
from llmpipe.data.tokenizer import copy_tokenizer
from llmpipe.data.verify import VerifyError, verify
from llmpipe.report import data_page
from tests.conftest import GPT2, SHARED_DATA, corpus_docs, merge, prepare, tiny_config, write_jsonl

LLAMA3 = SHARED_DATA / "tokenizers" / "llama3"


def store_docs(manifest):
    """doc_id -> (split, token list) from every shard of a store."""
    store, out = TokenStore(manifest), {}
    for entry in store.manifest["shards"]:
        with safe_open(str(store.root / entry["file"]), framework="numpy") as f:
            for split in ("train", "val"):
                toks, offs, ids = (f.get_tensor(f"{split}.{k}") for k in ("tokens", "offsets", "doc_ids"))
                for i, d in enumerate(ids):
                    out[int(d)] = (split, toks[offs[i] : offs[i + 1]].tolist())
    return out


def test_store_holds_every_document_as_the_hf_tokenizer_encodes_it(prepared):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(prepared["tokenizer"])
    texts = corpus_docs(60)
    docs = store_docs(prepared["manifest"])
    assert sorted(docs) == list(range(60))  # one source: doc id == record index
    for i, text in enumerate(texts):
        assert docs[i][1] == tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    splits = [docs[i][0] for i in range(60)]
    assert 0 < splits.count("val") < 20


def test_validation_split_does_not_depend_on_shard_count(tmp_path, prepared):
    cfg = tiny_config(prepared["root"], data={"num_shards": 5}, tokenizer={"source": str(prepared["tokenizer"])})
    out = prepare(tmp_path, cfg, views=())
    a, b = store_docs(prepared["manifest"]), store_docs(out["manifest"])
    assert {d: s for d, (s, _) in a.items()} == {d: s for d, (s, _) in b.items()}
    assert {d: t for d, (_, t) in a.items()} == {d: t for d, (_, t) in b.items()}


def gpt2_store(tmp_path, backend, docs):
    tmp_path.mkdir()
    write_jsonl(tmp_path / "corpus.jsonl", docs)
    cfg = tiny_config(tmp_path, tokenizer={"source": str(GPT2), "backend": backend}, data={"num_shards": 1})
    return prepare(tmp_path, cfg, views=())


def test_tiktoken_path_equals_hf_path_on_real_data(tmp_path):
    docs = corpus_docs(40) + ["literal <|endoftext|> inside a document", "  spaces\t\tand\n\n\nnewlines  "]
    fast = gpt2_store(tmp_path / "fast", "tiktoken", docs)
    slow = gpt2_store(tmp_path / "slow", "hf", docs)
    for store, name in ((fast, "tiktoken"), (slow, "hf")):
        assert TokenStore(store["manifest"]).manifest["shards"][0]["encoder"] == name
    assert store_docs(fast["manifest"]) == store_docs(slow["manifest"])
    assert 50256 in store_docs(fast["manifest"])[40][1][:-1]  # the literal special token, as HF encodes it


@pytest.mark.skipif(not LLAMA3.is_dir(), reason="needs ../shared/data/tokenizers/llama3")
def test_llama3_tiktoken_equals_hf_and_auto_bos(tmp_path):
    copy_tokenizer(LLAMA3, tmp_path / "tok")
    docs = corpus_docs(30)
    enc = make_encoder(tmp_path / "tok", "auto", docs[:5])
    assert enc.name == "tiktoken"
    assert enc.encode_batch(docs) == make_encoder(tmp_path / "tok", "hf", []).encode_batch(docs)
    write_jsonl(tmp_path / "corpus.jsonl", docs)
    cfg = tiny_config(tmp_path, tokenizer={"source": str(LLAMA3)}, data={"num_shards": 1})
    out = prepare(tmp_path, cfg, views=())
    for _, toks in store_docs(out["manifest"]).values():
        assert toks[0] == 128000 and toks[-1] == 128001 and 128000 not in toks[1:-1]


def test_tiktoken_falls_back_when_it_cannot_be_exact(tmp_path, caplog):
    spec = json.loads((GPT2 / "tokenizer.json").read_text())
    spec["normalizer"] = {"type": "NFKC"}
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text(json.dumps(spec))
    (tmp_path / "tok" / "tokenizer_config.json").write_text((GPT2 / "tokenizer_config.json").read_text())
    assert make_encoder(tmp_path / "tok", "auto", ["x"]).name == "hf"
    assert "tiktoken backend not usable" in caplog.text
    with pytest.raises(ValueError, match="cannot use it"):
        make_encoder(tmp_path / "tok", "tiktoken", ["x"])


def test_store_refuses_shards_from_two_tokenizers(tmp_path, prepared):
    cfg = merge(prepared["cfg"], {"tokenizer": {"backend": "hf"}})
    copy_tokenizer(GPT2, tmp_path / "gpt2")
    a, b = tmp_path / "shard-00000.safetensors", tmp_path / "shard-00001.safetensors"
    tokenize_shard(cfg, prepared["sources"], 0, prepared["tokenizer"], a)
    tokenize_shard(cfg, prepared["sources"], 1, tmp_path / "gpt2", b)
    with pytest.raises(ValueError, match="different tokenizer"):
        build_manifest([a, b], tmp_path / "manifest.json")


def test_store_refuses_shards_made_with_other_data_settings(tmp_path, prepared):
    a, b = tmp_path / "shard-00000.safetensors", tmp_path / "shard-00001.safetensors"
    tokenize_shard(prepared["cfg"], prepared["sources"], 0, prepared["tokenizer"], a)
    tokenize_shard(merge(prepared["cfg"], {"data": {"val_fraction": 0.5}}), prepared["sources"], 1, prepared["tokenizer"], b)
    with pytest.raises(ValueError, match="data setup"):
        build_manifest([a, b], tmp_path / "manifest.json")


def test_store_refuses_missing_or_repeated_shards(tmp_path, prepared):
    """A tokenize job killed part way leaves some shards: the store names the missing ones, not a smaller store."""
    a, b = tmp_path / "shard-00000.safetensors", tmp_path / "shard-00001.safetensors"
    for i, path in enumerate((a, b)):
        tokenize_shard(prepared["cfg"], prepared["sources"], i, prepared["tokenizer"], path)
    with pytest.raises(ValueError, match=r"1 shards given for 2, shards 1 missing"):
        build_manifest([a], tmp_path / "manifest.json")
    with pytest.raises(ValueError, match=r"shards 0 missing"):
        build_manifest([b], tmp_path / "manifest.json")
    with pytest.raises(ValueError, match=r"out of order or repeated \(1, 0\)"):
        build_manifest([b, a], tmp_path / "manifest.json")
    assert not (tmp_path / "manifest.json").exists()
    assert build_manifest([a, b], tmp_path / "manifest.json")["totals"] == json.loads(prepared["manifest"].read_text())["totals"]


def test_skipped_records_are_counted_through_the_store(tmp_path):
    good = corpus_docs(12)
    lines = [json.dumps({"text": t}) for t in good[:6]] + ["{broken", json.dumps({"body": "x"}), json.dumps({"text": ""})]
    lines += [json.dumps({"text": t}) for t in good[6:]]
    (tmp_path / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    cfg = tiny_config(tmp_path, data={"on_bad_record": "skip"}, tokenizer={"source": str(GPT2)})
    out = prepare(tmp_path, cfg, views=())
    read = TokenStore(out["manifest"]).manifest["read"]
    assert read["documents"] == 12 and read["skipped"] == {"bad_json": 1, "missing_field": 1, "empty": 1}
    texts = [t for _, t in sorted((d, toks) for d, (_, toks) in store_docs(out["manifest"]).items())]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(GPT2)
    assert texts == [tok(t)["input_ids"] + [50256] for t in good]  # good documents kept, in order


def test_view_refuses_store_of_another_tokenizer(tmp_path, prepared):
    copy_tokenizer(GPT2, tmp_path / "gpt2")
    with pytest.raises(ValueError, match="was made with a tokenizer of sha256"):
        build_view(prepared["manifest"], "hf", tmp_path / "v", prepared["cfg"], tmp_path / "gpt2")


def test_hf_view_loads_as_nxd_loads_it(prepared):
    from transformers import default_data_collator

    seq = prepared["cfg"]["train"]["seq_len"]
    ds = datasets.load_from_disk(str(prepared["view"] / "train"))
    batch = default_data_collator([ds[i] for i in range(4)])
    for key in ("input_ids", "attention_mask", "labels"):
        assert str(batch[key].dtype) == "torch.int64" and tuple(batch[key].shape) == (4, seq)


def test_segment_ids_start_exactly_after_each_eos(prepared):
    eos = TokenStore(prepared["manifest"]).eos_id
    rows = datasets.load_from_disk(str(prepared["view"] / "val")).with_format("numpy")[:]
    for ids, mask, seg in zip(rows["input_ids"], rows["attention_mask"], rows["segment_ids"]):
        real = int(mask.sum())
        assert seg[0] == 0 and (seg[real:] == -1).all()
        changes = np.flatnonzero(np.diff(seg[:real])) + 1
        after_eos = np.flatnonzero(ids[: real - 1] == eos) + 1
        assert changes.tolist() == after_eos.tolist()


def read_litgpt(path):
    """Independent parser of the PackedDataset header spec."""
    raw = path.read_bytes()
    assert raw[:7] == b"LITPKDS"
    version, code, chunk = struct.unpack("<QBQ", raw[7:24])
    assert version == 1
    dtype = {8: np.uint16, 4: np.int32}[code]
    tokens = np.frombuffer(raw[24:], dtype=dtype)
    assert tokens.size == chunk
    return tokens


@pytest.mark.parametrize("remainder", ["drop", "pad", "carry"])
def test_every_view_conserves_tokens_under_each_policy(tmp_path, prepared, remainder):
    cfg = merge(
        prepared["cfg"],
        {"data": {"remainder": remainder, "val_remainder": remainder, "shuffle": False, "litgpt_sequences_per_file": 7}},
    )
    store = TokenStore(prepared["manifest"])
    seq = cfg["train"]["seq_len"]
    for split, folder in (("train", "train"), ("val", "validation")):
        stream = store.tokens(split)
        n, rest = stream.size, stream.size % seq
        # hf view, rows in stream order (shuffle off)
        build_view(prepared["manifest"], "hf", tmp_path / "hf", cfg)
        rows = datasets.load_from_disk(str(tmp_path / "hf" / split)).with_format("numpy")[:]
        got = rows["input_ids"][rows["attention_mask"] == 1]
        expect = {"drop": stream[: n - rest], "pad": stream, "carry": np.concatenate([stream, stream[: (seq - rest) % seq]])}[
            remainder
        ]
        assert got.tolist() == expect.tolist()
        # litgpt view: blocks of seq_len + 1
        build_view(prepared["manifest"], "litgpt", tmp_path / "lit", cfg)
        files = sorted((tmp_path / "lit" / folder).glob("*.bin"))
        assert files[0].name.startswith(f"{folder}_t_0_0000000000")
        flat = np.concatenate([read_litgpt(f) for f in files]).astype(np.int64)
        block = seq + 1
        info = json.loads((tmp_path / "lit" / "view.json").read_text())[split]
        assert flat.size % (block * info["sequences_per_file"]) == 0 and info["sequences_per_file"] <= 7
        r = n % block
        lit_expect = {"drop": stream[: n - r], "pad": stream, "carry": np.concatenate([stream, stream[: (block - r) % block]])}[
            remainder
        ]
        assert flat[: lit_expect.size].tolist() == lit_expect.tolist()
        assert (flat[lit_expect.size :] == store.eos_id).all()  # pad policy and file padding


def read_megatron_index(path):
    """Independent parser of Megatron's MMIDIDX v1 index: (dtype, lengths, pointers, doc index)."""
    raw = path.read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    version, code, seqs, docs = struct.unpack("<QBQQ", raw[9:34])
    assert version == 1
    lengths = np.frombuffer(raw, np.int32, seqs, 34)
    pointers = np.frombuffer(raw, np.int64, seqs, 34 + 4 * seqs)
    doc_index = np.frombuffer(raw, np.int64, docs, 34 + 12 * seqs)
    assert len(raw) == 34 + 12 * seqs + 8 * docs
    return {8: np.uint16, 4: np.int32}[code], lengths, pointers, doc_index


def test_megatron_view_holds_every_document_and_loads_in_megatron_core(tmp_path, prepared):
    from megatron.core.datasets.indexed_dataset import IndexedDataset  # the real reader (megatron-core)

    info = build_view(prepared["manifest"], "megatron", tmp_path / "mg", prepared["cfg"])
    docs, store = store_docs(prepared["manifest"]), TokenStore(prepared["manifest"])
    for split in ("train", "val"):
        order = [
            int(d)
            for e in store.manifest["shards"]  # documents in shard order, then record order
            for d in safe_open(str(store.root / e["file"]), framework="numpy").get_tensor(f"{split}.doc_ids")
        ]
        assert sorted(order) == sorted(d for d, (s, _) in docs.items() if s == split)
        want = [docs[d][1] for d in order]
        prefix = tmp_path / "mg" / f"{split}_text_document"
        dtype, lengths, pointers, doc_index = read_megatron_index(prefix.with_suffix(".idx"))
        assert dtype == np.uint16  # GPT-2 vocabulary < 65,500
        assert lengths.tolist() == [len(t) for t in want]
        assert pointers.tolist() == (np.cumsum([0] + lengths.tolist()[:-1]) * 2).tolist()
        assert doc_index.tolist() == list(range(len(want) + 1))
        flat = np.fromfile(prefix.with_suffix(".bin"), np.uint16)
        assert flat.tolist() == [x for t in want for x in t]
        ds = IndexedDataset(str(prefix))
        assert len(ds) == len(want) and ds.document_indices.tolist() == doc_index.tolist()
        assert all(ds[i].tolist() == want[i] for i in range(len(want)))
        assert info[split]["documents"] == len(want) and info[split]["tokens"] == flat.size
    stats = verify(
        prepared["manifest"],
        [tmp_path / "mg"],
        prepared["tokenizer"],
        prepared["root"] / "sources.json",
        prepared["cfg"]["data"],
        tmp_path / "stats.json",
        sample=0,
    )
    assert stats["views"]["megatron"]["conservation"]["train"]["tokens_checked"] == stats["tokens"]["train"]
    page = data_page(stats)  # the report's data page (report_items) shows a megatron view as documents
    for split in ("train", "val"):
        assert (
            f"<td>megatron</td><td>{split}</td><td>{info[split]['documents']:,} documents</td><td>{info[split]['tokens']:,}</td>"
            in page
        )
    bin_file = tmp_path / "mg" / "val_text_document.bin"  # a changed token is caught
    raw = bytearray(bin_file.read_bytes())
    raw[2:4] = struct.pack("<H", (struct.unpack("<H", raw[2:4])[0] + 1) % 500)
    bin_file.write_bytes(bytes(raw))
    with pytest.raises(VerifyError, match="megatron/val"):
        verify(
            prepared["manifest"],
            [tmp_path / "mg"],
            prepared["tokenizer"],
            prepared["root"] / "sources.json",
            prepared["cfg"]["data"],
            tmp_path / "stats2.json",
            sample=0,
        )


def test_shuffle_is_seeded_and_a_permutation(tmp_path, prepared):
    views = {}
    for name, over in (("a", {}), ("b", {}), ("c", {"shuffle_seed": 1}), ("s", {"shuffle": False})):
        build_view(prepared["manifest"], "hf", tmp_path / name, merge(prepared["cfg"], {"data": over}))
        views[name] = datasets.load_from_disk(str(tmp_path / name / "train")).with_format("numpy")[:]["input_ids"]
    assert np.array_equal(views["a"], views["b"])
    assert not np.array_equal(views["a"], views["c"])
    key = lambda rows: sorted(map(bytes, rows))  # noqa: E731
    assert key(views["a"]) == key(views["s"]) == key(views["c"])


def test_verify_proves_conservation_and_catches_tampering(tmp_path, prepared):
    root = prepared["root"]
    views = [prepared["view"], prepared["litgpt"]]
    stats = verify(
        prepared["manifest"],
        views,
        prepared["tokenizer"],
        root / "sources.json",
        prepared["cfg"]["data"],
        tmp_path / "stats.json",
    )
    assert stats["tokenization"]["documents_retokenized"] == 60
    assert stats["views"]["hf"]["conservation"]["val"]["tokens_checked"] == stats["tokens"]["val"]
    assert all(len(v["sha256"]) == 64 for v in stats["files"].values())
    tampered = tmp_path / "hf"
    import shutil

    shutil.copytree(prepared["view"], tampered)
    arrow = next((tampered / "val").glob("*.arrow"))
    raw = bytearray(arrow.read_bytes())
    ds = datasets.load_from_disk(str(prepared["view"] / "val"))
    first = int(ds[0]["input_ids"][5])
    pos = raw.find(struct.pack("<i", first) + struct.pack("<i", int(ds[0]["input_ids"][6])))
    raw[pos : pos + 4] = struct.pack("<i", (first + 1) % 500)
    arrow.write_bytes(bytes(raw))
    with pytest.raises(VerifyError, match="hf/val"):
        verify(
            prepared["manifest"],
            [tampered],
            prepared["tokenizer"],
            root / "sources.json",
            prepared["cfg"]["data"],
            tmp_path / "stats2.json",
            sample=0,
        )


def test_s3_sources_through_a_local_moto_server(tmp_path, monkeypatch):
    boto3 = pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        for k, v in {
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            monkeypatch.setenv(k, v)
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="corpus")
        docs = corpus_docs(9)
        for i in range(3):
            body = "".join(json.dumps({"text": d}) + "\n" for d in docs[i * 3 : (i + 1) * 3]).encode()
            import gzip

            s3.put_object(Bucket="corpus", Key=f"train.{i + 1}.jsonl.gz", Body=gzip.compress(body))
        cfg = tiny_config(
            tmp_path, data={"sources": ["s3://corpus/train.{1..3}.jsonl.gz"], "num_shards": 2}, tokenizer={"source": str(GPT2)}
        )
        out = prepare(tmp_path, cfg, views=())
        sources = json.loads((tmp_path / "sources.json").read_text())["sources"]
        assert [s["source"] for s in sources] == [f"s3://corpus/train.{i}.jsonl.gz" for i in (1, 2, 3)]
        assert all(s.get("etag") for s in sources)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(GPT2)
        got = store_docs(out["manifest"])
        assert len(got) == 9
        for (src, rec), text in zip([(s, r) for s in range(3) for r in range(3)], docs):
            assert got[(src << 40) | rec][1] == tok(text)["input_ids"] + [50256]
    finally:
        server.stop()


def test_more_shards_than_documents_pack_and_verify(tmp_path):
    """40 tokenize shards for 12 documents: most shards are empty; every view packs and verify proves
    the tokens conserved, with the same documents as one shard holds."""
    from tests.conftest import prepare, tiny_config, write_jsonl

    stores = {}
    for n in (1, 40):
        root = tmp_path / f"s{n}"
        root.mkdir()
        write_jsonl(root / "corpus.jsonl", corpus_docs(12))
        out = prepare(root, tiny_config(root, data={"num_shards": n}), views=("hf", "litgpt", "megatron"))
        stats = verify(
            out["manifest"],
            [root / "hf", root / "litgpt", root / "megatron"],
            out["tokenizer"],
            root / "sources.json",
            out["cfg"]["data"],
            root / "stats.json",
        )
        manifest = json.loads(out["manifest"].read_text())
        assert sum(1 for s in manifest["shards"] if s["counts"]["train"]["documents"] == 0) >= (40 - 12 if n == 40 else 0)
        stores[n] = (manifest["totals"], stats["views"]["hf"]["conservation"]["train"]["tokens_checked"])
    assert stores[1] == stores[40]


def test_a_views_fingerprint_follows_only_its_own_settings(tmp_path, prepared):
    """A run resumes on its view's fingerprint: a setting of another format (litgpt's file size for the hf
    view; packing settings for megatron's whole documents) leaves the files and the fingerprint alone, and
    verify accepts them; a setting of the format itself changes it."""

    def fingerprint(fmt, name, data=None, seq_len=None):
        cfg = merge(prepared["cfg"], {"data": data or {}, "train": {"seq_len": seq_len or prepared["cfg"]["train"]["seq_len"]}})
        return build_view(prepared["manifest"], fmt, tmp_path / name, cfg)["fingerprint"]

    hf = fingerprint("hf", "hf")
    assert fingerprint("hf", "hf-lit", {"litgpt_sequences_per_file": 7}) == hf
    assert fingerprint("hf", "hf-seg", {"segment_ids": not prepared["cfg"]["data"]["segment_ids"]}) != hf
    lit = fingerprint("litgpt", "lit")
    assert fingerprint("litgpt", "lit-seg", {"segment_ids": not prepared["cfg"]["data"]["segment_ids"]}) == lit
    assert fingerprint("litgpt", "lit-7", {"litgpt_sequences_per_file": 7}) != lit
    mg = fingerprint("megatron", "mg")
    assert fingerprint("megatron", "mg-2", {"remainder": "pad", "shuffle": False}, seq_len=17) == mg
    for a, b in (("hf", "hf-lit"), ("mg", "mg-2")):
        assert [p.read_bytes() for p in sorted((tmp_path / a).rglob("*")) if p.is_file()] == [
            p.read_bytes() for p in sorted((tmp_path / b).rglob("*")) if p.is_file()
        ], (a, b)
    other = {**prepared["cfg"]["data"], "litgpt_sequences_per_file": 7}  # pack's and verify's config now
    views = [tmp_path / "hf", tmp_path / "mg-2"]
    verify(
        prepared["manifest"],
        views,
        prepared["tokenizer"],
        prepared["root"] / "sources.json",
        other,
        tmp_path / "s.json",
        sample=0,
    )


def test_megatron_refuses_an_empty_split(tmp_path):
    """4 documents at val_fraction 0.01 leave val empty: the megatron view says so, as hf and litgpt do,
    instead of a 0-byte .bin that megatron-core cannot map."""

    write_jsonl(tmp_path / "corpus.jsonl", [f"Document {i} of four, a few words long." for i in range(4)])
    cfg = tiny_config(tmp_path, data={"val_fraction": 0.01, "num_shards": 1}, tokenizer={"source": str(GPT2)})
    prepared = prepare(tmp_path, cfg, views=())
    assert TokenStore(prepared["manifest"]).manifest["totals"]["val"]["documents"] == 0
    with pytest.raises(ValueError, match="val split has no documents"):
        build_view(prepared["manifest"], "megatron", tmp_path / "mg", cfg)
    assert not (tmp_path / "mg").exists()


def test_litgpt_files_share_the_rows_evenly_and_pad_under_a_block_a_file(tmp_path, prepared):
    """lit-gpt reads every block of every file as data, EOS padding too: a split is cut into the fewest
    files of at most litgpt_sequences_per_file blocks, all of one size, the padding under one block a file
    (1024 a file padded a 100-row split with 924 all-EOS blocks)."""
    from llmpipe.data.views.litgpt import read_file

    for most in (1024, 7, 3):
        cfg = merge(prepared["cfg"], {"data": {"litgpt_sequences_per_file": most}})
        info = build_view(prepared["manifest"], "litgpt", tmp_path / str(most), cfg)
        for split, folder in (("train", "train"), ("val", "validation")):
            s, files = info[split], sorted((tmp_path / str(most) / folder).glob("*.bin"))
            per, block = s["sequences_per_file"], s["block"]
            assert len(files) == s["files"] == -(-s["rows"] // most) and per <= most
            assert {read_file(f).size for f in files} == {per * block}
            assert s["file_pad_tokens"] == (len(files) * per - s["rows"]) * block < len(files) * block
            last = read_file(files[-1]).reshape(per, block)
            eos_blocks = int((last == TokenStore(prepared["manifest"]).eos_id).all(axis=1).sum())
            assert eos_blocks == s["file_pad_tokens"] // block, (most, split)
            if s["rows"] <= most:  # one file of exactly its rows
                assert len(files) == 1 and s["file_pad_tokens"] == 0
