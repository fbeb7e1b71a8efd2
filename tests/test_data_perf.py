"""The data engine's fast paths give exactly what the plain ones give (issue 3, Performance):
batched rows vs row(), batched shard writes vs per-document arrays, records of other shards left
unparsed, the byte-level vocabulary check, the HF encoder's ids vs AutoTokenizer's, tiktoken's joined call
vs encoding each document alone."""

import json

import numpy as np
import orjson
import pytest

from llmpipe import config as cfgmod
from llmpipe.data import shard_set
from llmpipe.data.encoders import HFEncoder, TiktokenEncoder, make_encoder
from llmpipe.data.pack import Layout, row, rows
from llmpipe.data.readers import BadRecord, ReadStats, documents
from llmpipe.data.shard_set import SplitWriter as _SplitWriter
from llmpipe.data.token_store import SplitStream
from llmpipe.data.tokenize import tokenize_shard
from llmpipe.data.tokenizer import load_tokenizer
from tests.conftest import GPT2, SHARED_DATA, corpus_docs, gpt2_shard_inputs, prepare, tiny_config, write_jsonl

LLAMA3 = SHARED_DATA / "tokenizers" / "llama3"


@pytest.mark.parametrize("remainder", ["drop", "pad", "carry"])
def test_batched_rows_equal_row_by_row(remainder):
    rng = np.random.default_rng({"drop": 0, "pad": 1, "carry": 2}[remainder])
    checked = 0
    for _ in range(150):
        lengths = rng.integers(1, 30, int(rng.integers(1, 40)))
        stream = rng.integers(1, 50_000, int(lengths.sum()))
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        seq_len = int(rng.integers(1, 25))
        if remainder == "carry" and stream.size < seq_len:
            continue
        layout = Layout(stream.size, seq_len, remainder)
        if layout.rows == 0:
            continue
        idx = rng.permutation(layout.rows)
        read = lambda a, b, stream=stream: stream[a:b]
        for doc_starts in (starts, None):
            ids, mask, segs = rows(read, layout, idx, 7, doc_starts, np.int32, np.int16)
            assert ids.dtype == np.int32 and mask.dtype == np.int8 and ids.shape == (idx.size, seq_len)
            assert (segs is None) == (doc_starts is None) and (segs is None or segs.dtype == np.int16)
            for j, i in enumerate(idx.tolist()):
                want = row(read, layout, i, 7, doc_starts)
                assert ids[j].tolist() == want[0].tolist() and mask[j].tolist() == want[1].tolist()
                if doc_starts is not None:
                    assert segs[j].tolist() == want[2].tolist()
            checked += 1
    assert checked > 100


def _stream_of(shards: list[np.ndarray]) -> SplitStream:
    """A SplitStream over in-memory shards (as the store's memmaps are read)."""
    s = SplitStream.__new__(SplitStream)
    s.split, s._tokens, s.dtype = "train", shards, shards[0].dtype
    s.starts = np.concatenate([[0], np.cumsum([t.size for t in shards])]).astype(np.int64)
    s.size = int(s.starts[-1])
    return s


def test_gathered_rows_equal_rows_read_one_by_one():
    """SplitStream.full_rows (a [rows, L] view per shard, one np.take) gives the rows read() gives, rows
    crossing shard boundaries, empty shards and shards shorter than a row included."""
    rng = np.random.default_rng(5)
    checked = 0
    for _ in range(200):
        sizes = rng.choice([0, 1, 3, 7, 20, 64, 100], int(rng.integers(1, 6)))
        shards = [rng.integers(0, 60_000, int(n)).astype(np.uint16) for n in sizes]
        stream = _stream_of(shards)
        seq_len = int(rng.integers(1, 30))
        layout = Layout(stream.size, seq_len, "pad" if stream.size % seq_len else "drop")
        if layout.rows == 0:
            continue
        idx = rng.permutation(layout.rows)
        lengths = rng.integers(1, 9, stream.size)
        starts = np.unique(np.concatenate([[0], np.cumsum(lengths)]))
        starts = starts[starts < stream.size]
        for doc_starts in (starts, None):
            want = rows(stream.view, layout, idx, 7, doc_starts, np.int32, np.int16)
            got = rows(stream.view, layout, idx, 7, doc_starts, np.int32, np.int16, stream.full_rows)
            for a, b in zip(want, got):
                assert (a is None and b is None) or (a.dtype == b.dtype and a.tolist() == b.tolist())
        checked += 1
    assert checked > 150


@pytest.mark.parametrize("dtype,prefix,suffix", [(np.uint16, [], [0]), (np.uint32, [70_000], [70_001]), (np.uint16, [1, 2], [3])])
def test_split_writer_batches_equal_per_document_arrays(tmp_path, dtype, prefix, suffix):
    rng = np.random.default_rng(3)
    w = _SplitWriter(tmp_path / "split.bin", np.dtype(dtype))
    docs, dids = [], []
    for batch in range(4):
        part = [rng.integers(0, 60_000, int(n)).tolist() for n in rng.integers(0, 50, 7)]
        part_ids = [batch * 100 + k for k in range(len(part))]
        w.add_batch(part, part_ids, prefix, suffix)
        docs += part
        dids += part_ids
    w.add_batch([], [], prefix, suffix)
    w.fh.close()
    got = np.fromfile(tmp_path / "split.bin", dtype)
    want = [prefix + d + suffix for d in docs]
    assert got.tolist() == [t for d in want for t in d]
    assert list(w.offsets) == np.concatenate([[0], np.cumsum([len(d) for d in want])]).tolist()
    assert list(w.doc_ids) == dids and w.counts() == {"documents": len(docs), "tokens": got.size}


def test_records_of_other_shards_are_not_parsed(tmp_path, monkeypatch):
    lines = ['{"text": "r0"}', "", "{not json", '{"text": "r2"}', "  ", '{"other": 1}', '{"text": "r4"}', '{"text": "r5"}']
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    src = str(tmp_path / "c.jsonl")
    parsed = []
    real = orjson.loads
    monkeypatch.setattr(orjson, "loads", lambda raw: parsed.append(bytes(raw).strip()) or real(raw))
    cfg = cfgmod.load({"data": {"sources": [src], "on_bad_record": "fail"}})["data"]

    # records (blank lines are not records): 0 r0, 1 bad JSON, 2 r2, 3 no text field, 4 r4, 5 r5
    even = list(documents(src, cfg, ReadStats(), lambda i: i % 2 == 0))
    assert even == [(0, "r0"), (2, "r2"), (4, "r4")]
    assert parsed == [b'{"text": "r0"}', b'{"text": "r2"}', b'{"text": "r4"}']  # the odd records: not parsed
    with pytest.raises(BadRecord, match=r"c\.jsonl:3"):  # record 1 is on line 3
        list(documents(src, cfg, ReadStats(), lambda i: i % 2 == 1))
    stats = ReadStats()
    assert list(documents(src, {**cfg, "on_bad_record": "skip"}, stats, lambda i: i % 2 == 1)) == [(5, "r5")]
    assert dict(stats.skipped) == {"bad_json": 1, "missing_field": 1}


def test_vocabulary_that_is_not_byte_level_is_refused(tmp_path, caplog):
    spec = json.loads((GPT2 / "tokenizer.json").read_text())
    spec["model"]["vocab"]["a b"] = len(spec["model"]["vocab"])  # a raw space is not a byte-level character
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text(json.dumps(spec))
    (tmp_path / "tok" / "tokenizer_config.json").write_text((GPT2 / "tokenizer_config.json").read_text())
    with pytest.raises(ValueError, match="'a b' is not byte-level"):
        TiktokenEncoder(tmp_path / "tok", 1)
    assert make_encoder(tmp_path / "tok", "auto", ["x"]).name == "hf"


def test_hf_encoder_ids_equal_auto_tokenizer_ids():
    docs = corpus_docs(12) + ["<|endoftext|> inside", " ünïcödé 😀 \n\n x"]
    want = load_tokenizer(GPT2)(docs, add_special_tokens=False)["input_ids"]
    assert HFEncoder(GPT2, 1).encode_batch(docs) == want
    fast = TiktokenEncoder(GPT2, 1)
    assert fast.encode_batch(docs) == want and TiktokenEncoder(GPT2, 2).encode_batch(docs) == want


@pytest.fixture(scope="module")
def gpt2_store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("store")
    write_jsonl(tmp / "corpus.jsonl", corpus_docs(40))
    cfg = tiny_config(tmp, tokenizer={"source": str(GPT2)}, data={"num_shards": 2})
    return prepare(tmp, cfg, views=())["manifest"]


@pytest.mark.parametrize("seq_len,segment_ids,remainder", [(16, True, "drop"), (16, False, "carry"), (40_000, True, "pad")])
def test_hf_view_files_equal_what_datasets_writes(tmp_path, gpt2_store, seq_len, segment_ids, remainder):
    """Reference: datasets' own ArrowWriter fed the same record batches, and the DatasetInfo that
    Dataset.from_file reads back, serialized as save_to_disk does; but for the feature type's name, which
    ours writes as datasets < 4 does ("Sequence", read as List(length=) by datasets 4+: NxD pins 3.6)."""
    from dataclasses import asdict

    import datasets
    import pyarrow as pa
    from datasets.arrow_writer import ArrowWriter

    from llmpipe.data.token_store import TokenStore
    from llmpipe.data.views import hf

    out = tmp_path / "view"
    hf.write_split(TokenStore(gpt2_store), "train", out, seq_len, remainder, True, 5, segment_ids)
    ours = (out / "data-00000-of-00001.arrow").read_bytes()
    table = pa.ipc.open_stream(ours).read_all()
    assert table.num_rows >= 1 and (seq_len > 16 or table.to_batches()[0].num_rows == hf.ROWS_PER_BATCH)
    cols = {"input_ids": "int32", "attention_mask": "int8", "labels": "int32"}
    if segment_ids:
        cols["segment_ids"] = "int16" if seq_len < 2**15 else "int32"
    assert table.column_names == list(cols)
    features = datasets.Features({k: datasets.List(datasets.Value(v), length=seq_len) for k, v in cols.items()})
    ref = tmp_path / "ref.arrow"
    with ArrowWriter(features=features, path=str(ref)) as writer:
        for batch in table.to_batches():
            writer.write_table(pa.Table.from_batches([batch]))
        writer.finalize()
    theirs = pa.ipc.open_stream(ref.read_bytes()).read_all()
    assert table.equals(theirs) and table.schema.equals(theirs.schema, check_metadata=False)
    meta = {k: v.replace(b'"Sequence"', b'"List"') for k, v in table.schema.metadata.items()}
    assert meta == theirs.schema.metadata and b'"List"' not in b"".join(table.schema.metadata.values())
    info = asdict(datasets.Dataset.from_file(str(ref)).info)
    want = json.dumps({k: info[k] for k in sorted(info)}, indent=2)
    assert (out / "dataset_info.json").read_text() == want.replace('"List"', '"Sequence"')
    loaded = datasets.load_from_disk(str(out))
    assert loaded.features == features and loaded.num_rows == table.num_rows


def test_hf_view_over_the_file_bound_is_cut_into_files_as_save_to_disk_cuts_it(tmp_path, gpt2_store, monkeypatch):
    """A view over datasets' 500 MB bound is several files, written at once: the same names and rows per
    file as Dataset.save_to_disk(max_shard_size=) writes, the same rows as one file, and verify reads them all."""
    import datasets

    from llmpipe.data.token_store import TokenStore
    from llmpipe.data.verify import VerifyError, verify_hf
    from llmpipe.data.views import hf

    store = TokenStore(gpt2_store)
    hf.write_split(store, "train", tmp_path / "one", 16, "drop", True, 5, True)
    monkeypatch.setattr(hf, "MAX_FILE_BYTES", 100_000)
    hf.write_split(store, "train", tmp_path / "many", 16, "drop", True, 5, True)
    one, many = datasets.load_from_disk(str(tmp_path / "one")), datasets.load_from_disk(str(tmp_path / "many"))
    assert many.num_rows == one.num_rows and many[:]["input_ids"] == one[:]["input_ids"]
    assert many[:]["segment_ids"] == one[:]["segment_ids"]
    one.save_to_disk(str(tmp_path / "ref"), max_shard_size=100_000)
    names = sorted(p.name for p in (tmp_path / "ref").glob("*.arrow"))
    assert len(names) > 2 and names == sorted(p.name for p in (tmp_path / "many").glob("*.arrow"))
    for name in names:
        rows = [datasets.Dataset.from_file(str(tmp_path / d / name)).num_rows for d in ("ref", "many")]
        assert rows[0] == rows[1]

    view = tmp_path / "view"
    info = {"seq_len": 16}  # and per split what view.json holds: write_split's stats
    for split in ("train", "val"):
        info[split] = hf.write_split(store, split, view / split, 16, "drop", split == "train", 5, True)
    assert verify_hf(store, view, info)["train"]["rows"] == one.num_rows
    (view / "train" / names[1]).unlink()
    with pytest.raises(VerifyError, match=names[1]):
        verify_hf(store, view, info)


EDGE_DOCS = ["", " ", "ends with spaces   ", "\n\nstarts with new lines", "tabs\t\t", "ünïcödé 😀 日本語", "'s 're", "x"]


def test_joined_tiktoken_call_gives_each_documents_own_ids():
    """encode_docs: one tiktoken call on documents joined by EOS gives, per document, the HF tokenizer's ids
    of that document alone + EOS; whitespace at a document's end never merges into the next one."""
    docs = corpus_docs(20) + EDGE_DOCS + EDGE_DOCS[::-1]
    fast, hf = TiktokenEncoder(GPT2, 1), HFEncoder(GPT2, 1)
    ids, lengths = fast.encode_docs(docs, [], [50256])
    want = [d + [50256] for d in hf.encode_batch(docs)]
    assert lengths.tolist() == [len(w) for w in want]
    assert ids.tolist() == [t for w in want for t in w]


def test_joined_tiktoken_call_declines_what_it_cannot_do_exactly():
    fast = TiktokenEncoder(GPT2, 1)
    assert fast.encode_docs(["a", "literal <|endoftext|> inside"], [], [50256]) is None  # HF matches it: per document
    assert fast.encode_docs(["a"], [], [13]) is None  # "." is no added token: it cannot mark the end
    assert fast.encode_docs(["a"], [50256], [50256]) is None  # BOS == EOS: the ends cannot be told apart
    fast.set_long(long_chars=100)
    assert fast.encode_docs(["a", "b" * 101], [], [50256]) is None  # long documents go piecewise


@pytest.mark.skipif(not LLAMA3.is_dir(), reason="needs ../shared/data/tokenizers/llama3")
def test_joined_tiktoken_call_with_bos_equals_hf():
    docs = corpus_docs(10) + EDGE_DOCS
    ids, lengths = TiktokenEncoder(LLAMA3, 1).encode_docs(docs, [128000], [128001])
    want = [[128000] + d + [128001] for d in HFEncoder(LLAMA3, 1).encode_batch(docs)]
    assert ids.dtype == np.uint32 and lengths.tolist() == [len(w) for w in want]
    assert ids.tolist() == [t for w in want for t in w]


def test_shard_from_joined_calls_equals_the_per_document_path(tmp_path, monkeypatch):
    """The tiktoken path's store is byte for byte the one of encoding each document alone."""
    docs = corpus_docs(30) + EDGE_DOCS[1:] + ["literal <|endoftext|> inside a document"]
    cfg, sources = gpt2_shard_inputs(tmp_path, docs, "tiktoken")
    monkeypatch.setattr(shard_set, "BATCH_DOCS", 8)  # batches without the literal and one with it
    calls = []
    joined = TiktokenEncoder.encode_docs

    def counted(self, *args):
        out = joined(self, *args)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(TiktokenEncoder, "encode_docs", counted)
    tokenize_shard(cfg, sources, 0, GPT2, tmp_path / "joined.safetensors")
    assert calls.count(True) >= 1 and calls.count(False) >= 1  # joined calls wrote; the batch with the literal did not
    monkeypatch.setattr(TiktokenEncoder, "encode_docs", lambda self, *a: None)
    tokenize_shard(cfg, sources, 0, GPT2, tmp_path / "per-document.safetensors")
    assert (tmp_path / "joined.safetensors").read_bytes() == (tmp_path / "per-document.safetensors").read_bytes()


def test_shard_header_over_its_room_is_copied_into_the_same_tensors(tmp_path, monkeypatch):
    """A shard's train tokens are written in place after HEADER_ROOM bytes; a header that needs more
    (e.g. read stats of thousands of sources) is written the long way: same tensors, same metadata."""
    from safetensors import safe_open

    cfg, sources = gpt2_shard_inputs(tmp_path, corpus_docs(30))
    tokenize_shard(cfg, sources, 0, GPT2, tmp_path / "in-place.safetensors")
    monkeypatch.setattr(shard_set, "HEADER_ROOM", 64)
    tokenize_shard(cfg, sources, 0, GPT2, tmp_path / "copied.safetensors")
    files = [safe_open(str(tmp_path / f"{n}.safetensors"), "numpy") for n in ("in-place", "copied")]
    assert files[0].metadata() == files[1].metadata() and files[0].keys() == files[1].keys()
    for key in files[0].keys():
        assert files[0].get_tensor(key).tolist() == files[1].get_tensor(key).tolist()
    assert files[0].get_tensor("train.tokens").size > 1000
    assert (tmp_path / "copied.safetensors").stat().st_size < (tmp_path / "in-place.safetensors").stat().st_size
    assert not list(tmp_path.glob(".*.tmp-*"))  # no temporary files left


@pytest.mark.parametrize(("command", "own", "threads"), [("pack", None, 1), ("pack", "2", 2), ("check-config", None, None)])
def test_data_steps_start_openblas_with_one_thread(command, own, threads):
    """A data step's numpy has one OpenBLAS thread (no spinning threads per core beside parallel jobs); a
    user's own OPENBLAS_NUM_THREADS stands; other commands keep numpy's default (one per core)."""
    import os
    import subprocess
    import sys

    probe = (
        "import contextlib, os, sys\n"
        "from llmpipe.__main__ import main\n"
        f"with contextlib.suppress(SystemExit): main([{command!r}, '--help'])\n"
        "import numpy\n"
        "print(len(os.listdir('/proc/self/task')), os.cpu_count())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    if own:
        env["OPENBLAS_NUM_THREADS"] = own
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    tasks, cores = map(int, out.split()[-2:])
    if threads:
        assert tasks == threads
    else:  # numpy's default: a thread per core, up to OpenBLAS's build limit and the CPU affinity mask
        assert tasks > 1 or cores == 1


def test_lazy_doc_starts_answer_as_the_whole_array(tmp_path):
    """pack's segment ids ask the document starts per batch (DocStarts: the shards' offsets, never one array
    of every document, which was 16 bytes a document at its peak): the same answers as the array, with
    empty shards between (more shards than documents) and queries past both ends."""
    import numpy as np

    from llmpipe.data.token_store import TokenStore

    write_jsonl(tmp_path / "corpus.jsonl", corpus_docs(9))
    cfg = tiny_config(tmp_path, tokenizer={"source": str(GPT2)}, data={"num_shards": 13})
    stream = TokenStore(prepare(tmp_path, cfg, views=())["manifest"]).split("train")
    whole, lazy = stream.doc_starts(), stream.lazy_doc_starts()
    assert lazy.size == whole.size > 0 and (np.diff(stream.starts) == 0).any()  # some shards are empty
    q = np.concatenate([np.arange(-2, stream.size + 3), np.random.default_rng(0).integers(0, stream.size, 500)])
    for side in ("left", "right"):
        assert np.array_equal(lazy.searchsorted(q, side=side), np.searchsorted(whole, q, side=side)), side
    i = np.random.default_rng(1).integers(0, whole.size, 300)
    assert np.array_equal(lazy[i], whole[i]) and np.array_equal(lazy[np.arange(whole.size)], whole)
