"""verify is exact: it passes on every correct view under every remainder policy, and a single changed
value a trainer reads (hf columns, lit-gpt tokens padding included, megatron tokens, the token store's
own bytes with the views rebuilt from them) fails it with the file and the position named.

Expected positions come from the store and the pack layout (Layout, order), never from constants."""

from __future__ import annotations

import json
import re
import shutil
import struct

import numpy as np
import pyarrow as pa
import pytest

from llmpipe.data.pack import Layout, order
from llmpipe.data.pack_views import build_view
from llmpipe.data.token_store import TokenStore
from llmpipe.data.verify import VerifyError, verify
from tests.conftest import GPT2, corpus_docs, merge, prepare, tiny_config, write_jsonl

PER_FILE = 16  # lit-gpt sequences per file: several files, the last one padded
POLICIES = [("drop", "pad"), ("pad", "carry"), ("carry", "drop"), ("carry", "carry")]  # (train, val)


def per_file(view, split) -> int:
    """Blocks in each file of a litgpt split (at most PER_FILE, the rows shared evenly over the files)."""
    return json.loads((view / "view.json").read_text())[split]["sequences_per_file"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A real store (GPT-2 tokenizer, 2 shards, > 2 documents per shard) and a seq_len whose rows leave a
    partial last row in both splits, for hf rows (seq_len) and lit-gpt blocks (seq_len + 1)."""
    tmp = tmp_path_factory.mktemp("verify_exact")
    write_jsonl(tmp / "corpus.jsonl", corpus_docs(40))
    cfg = tiny_config(tmp, data={"num_shards": 2, "val_fraction": 0.15}, tokenizer={"source": str(GPT2)})
    out = prepare(tmp, cfg, views=())
    ts = TokenStore(out["manifest"])
    sizes = [ts.split(s).size for s in ("train", "val")]
    seq_len = next(L for L in range(64, 128) if all(n % L and n % (L + 1) for n in sizes))
    cfg = merge(cfg, {"train": {"seq_len": seq_len}, "data": {"litgpt_sequences_per_file": PER_FILE}})
    return {**out, "cfg": cfg, "seq_len": seq_len}


def copied_shard(store, tmp_path):
    """(a copy of the store, its first shard, that shard's safetensors header with each tensor's file
    offset as `at`), for tests that change bytes in place."""
    tokens = tmp_path / "tokens"
    shutil.copytree(store["tokens"], tokens)
    shard = tokens / "shard-00000.safetensors"
    with open(shard, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    for name, entry in header.items():
        if name != "__metadata__":
            entry["at"] = 8 + n + entry["data_offsets"][0]
    return tokens, shard, header


def config(store, train="drop", val="pad"):
    return merge(store["cfg"], {"data": {"remainder": train, "val_remainder": val}})


def build(store, tmp_path, cfg, fmts=("hf", "litgpt", "megatron"), manifest=None):
    return [
        tmp_path / f for f in fmts if build_view(manifest or store["manifest"], f, tmp_path / f, cfg, store["tokenizer"]) or True
    ]


def run_verify(store, views, cfg, tmp_path, manifest=None, sample=0):
    return verify(
        manifest or store["manifest"],
        views,
        store["tokenizer"],
        store["root"] / "sources.json",
        cfg["data"],
        tmp_path / "stats.json",
        sample=sample,
    )


def layout(store, split, cfg, fmt):
    stream = TokenStore(store["manifest"]).split(split)
    d = cfg["data"]
    L = cfg["train"]["seq_len"] + (1 if fmt == "litgpt" else 0)
    lay = Layout(stream.size, L, d["remainder"] if split == "train" else d["val_remainder"])
    perm = order(lay.rows, d["shuffle"] if split == "train" else False, d["shuffle_seed"])
    return lay, perm


def fails(match_parts, fn):
    with pytest.raises(VerifyError) as e:
        fn()
    msg = str(e.value)
    for part in match_parts:
        assert re.search(part, msg), (part, msg)
    return msg


# ---------------------------------------------------------------- (a) correct views pass


@pytest.mark.parametrize("train,val", POLICIES)
def test_every_view_passes_under_every_remainder_policy(store, tmp_path, train, val):
    cfg = config(store, train, val)
    views = build(store, tmp_path, cfg)
    stats = run_verify(store, views, cfg, tmp_path, sample=8)
    assert stats["tokenization"]["documents_retokenized"] == 16
    assert stats["store"]["shards"] == 2
    for split, policy in (("train", train), ("val", val)):
        for fmt in ("hf", "litgpt"):
            lay, _ = layout(store, split, cfg, fmt)
            assert lay.rest, "the fixture's seq_len leaves a partial last row"
            got = stats["views"][fmt]["conservation"][split]
            real = lay.rows * lay.row_len if policy == "carry" else lay.stats()["tokens_packed"]
            assert got["tokens_checked"] == real  # every real position, wrapped tokens included
        mg = stats["views"]["megatron"]["conservation"][split]
        assert mg["tokens_checked"] == stats["tokens"][split]


# ---------------------------------------------------------------- (b) one changed value fails, named


def arrow_value_offset(path, row, column, pos):
    """(byte offset, numpy dtype) of `column`[row][pos] in an Arrow IPC stream file."""
    buf = pa.memory_map(str(path)).read_buffer()
    base, k = buf.address, 0
    for batch in pa.ipc.open_stream(buf):
        if row < k + batch.num_rows:
            col = batch.column(column)
            values = col.values
            dtype = values.type.to_pandas_dtype()
            i = values.offset + (col.offset + row - k) * col.type.list_size + pos
            return values.buffers()[1].address - base + i * np.dtype(dtype).itemsize, np.dtype(dtype)
        k += batch.num_rows
    raise IndexError(row)


def patch(path, at, dtype, new=None):
    """Change one value in a file in place: to `new`, or to a different value."""
    dtype = np.dtype(dtype).newbyteorder("<")
    with open(path, "r+b") as fh:
        fh.seek(at)
        old = int(np.frombuffer(fh.read(dtype.itemsize), dtype)[0])
        value = new if new is not None else (old + 1 if old < 1000 else old - 1)
        fh.seek(at)
        fh.write(np.asarray([value], dtype).tobytes())
    return old, value


def copy_view(store, tmp_path, cfg, fmt, name):
    src = tmp_path / "clean" / fmt
    if not src.exists():
        build(store, tmp_path / "clean", cfg, (fmt,))
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def first_pad_row(lay, perm):
    """(file row holding the stream's partial last row, first padded position)."""
    return int(np.flatnonzero(perm == lay.rows - 1)[0]), lay.rest


@pytest.mark.parametrize(
    "column,split,where",
    [
        ("input_ids", "train", "real"),
        ("labels", "train", "real"),
        ("attention_mask", "train", "real"),
        ("segment_ids", "train", "real"),
        ("input_ids", "val", "pad"),  # an input id under attention_mask 0: the old check looked at real ones only
        ("segment_ids", "val", "pad"),
        ("labels", "val", "pad"),
    ],
)
def test_hf_one_changed_value_is_named(store, tmp_path, column, split, where):
    cfg = config(store, "pad", "pad")
    view = copy_view(store, tmp_path, cfg, "hf", f"hf_{column}_{split}_{where}")
    lay, perm = layout(store, split, cfg, "hf")
    if where == "pad":
        row, pos = first_pad_row(lay, perm)
    else:
        row, pos = 1, lay.row_len // 3
    arrow = next((view / split).glob("*.arrow"))
    at, dtype = arrow_value_offset(arrow, row, column, pos)
    patch(arrow, at, dtype, new=0 if column == "attention_mask" else None)
    fails(
        [re.escape(str(arrow)), f"row {row} ", f"position {pos}:", column, f"hf/{split}"],
        lambda: run_verify(store, [view], cfg, tmp_path),
    )


@pytest.mark.parametrize("where", ["real", "pad", "file_pad"])
def test_litgpt_one_changed_token_is_named(store, tmp_path, where):
    """`pad`: a padded position of the stream's last (partial) row: lit-gpt trains on it, so its value must be
    exactly the packer's pad token; `file_pad`: a sequence past the last row in the last file."""
    cfg = config(store, "pad", "pad")
    view = copy_view(store, tmp_path, cfg, "litgpt", f"litgpt_{where}")
    split, folder = "val", "validation"
    lay, perm = layout(store, split, cfg, "litgpt")
    if where == "real":
        g, pos = 2, 5
    elif where == "pad":
        g, pos = first_pad_row(lay, perm)
    else:
        per = per_file(view, split)
        assert lay.rows % per, "the last file has padding sequences"
        g, pos = lay.rows, 0
    files = sorted((view / folder).glob("*.bin"))
    path, row = files[g // per_file(view, split)], g % per_file(view, split)
    from llmpipe.data.views.litgpt import HEADER

    old, _ = patch(path, HEADER.size + (row * lay.row_len + pos) * 2, np.uint16)
    if where != "real":
        assert old == TokenStore(store["manifest"]).eos_id  # the pad token is what was there
    fails(
        [re.escape(str(path)), f"sequence {row} ", f"position {pos}:", f"litgpt/{split}"],
        lambda: run_verify(store, [view], cfg, tmp_path),
    )


def test_litgpt_carry_view_passes_and_a_wrapped_token_is_named(store, tmp_path):
    """The last train row under carry is completed with the stream's first tokens: verify reads them as data."""
    cfg = config(store, "carry", "carry")
    view = copy_view(store, tmp_path, cfg, "litgpt", "litgpt_carry")
    run_verify(store, [view], cfg, tmp_path)
    lay, perm = layout(store, "train", cfg, "litgpt")
    g = int(np.flatnonzero(perm == lay.rows - 1)[0])
    path, row = sorted((view / "train").glob("*.bin"))[g // per_file(view, "train")], g % per_file(view, "train")
    from llmpipe.data.views.litgpt import HEADER

    patch(path, HEADER.size + (row * lay.row_len + lay.row_len - 1) * 2, np.uint16)
    fails(
        [re.escape(str(path)), f"sequence {row} ", f"position {lay.row_len - 1}:", "litgpt/train"],
        lambda: run_verify(store, [view], cfg, tmp_path),
    )


def test_megatron_one_changed_token_is_named(store, tmp_path):
    cfg = config(store)
    view = copy_view(store, tmp_path, cfg, "megatron", "mg")
    bin_file = view / "train_text_document.bin"
    k = TokenStore(store["manifest"]).split("train").size // 2
    patch(bin_file, 2 * k, np.uint16)
    fails([re.escape(str(bin_file)), f"token {k} ", "megatron/train"], lambda: run_verify(store, [view], cfg, tmp_path))


def test_store_token_change_is_caught_with_views_rebuilt_from_it(store, tmp_path):
    """One token of the store changed, every view rebuilt from the changed store (so views and store agree):
    the recorded sha256 of the shard's split fails, and re-tokenizing the shard's documents names the token.
    The changed token sits in the shard's last document, past the re-tokenized sample."""

    tokens, shard, header = copied_shard(store, tmp_path)
    from safetensors import safe_open

    with safe_open(str(shard), framework="numpy") as f:
        offsets = f.get_tensor("train.offsets")
    assert offsets.size - 1 > 2, "more documents than the sample of 2"
    k = int(offsets[-1]) - 2  # the last document's token before its EOS
    at = header["train.tokens"]["at"] + 2 * k
    patch(shard, at, np.uint16)
    cfg = config(store, "carry", "pad")
    views = build(store, tmp_path / "v", cfg, manifest=tokens / "manifest.json")
    fails(
        [re.escape(str(shard)), "train.tokens", "sha256", f"first changed token at index {k} "],
        lambda: run_verify(store, views, cfg, tmp_path, manifest=tokens / "manifest.json", sample=2),
    )


def test_unshuffled_view_without_segment_ids_passes_and_a_config_mismatch_is_named(store, tmp_path):
    cfg = merge(config(store, "pad", "carry"), {"data": {"shuffle": False, "segment_ids": False}})
    views = build(store, tmp_path, cfg, ("hf", "litgpt"))
    run_verify(store, views, cfg, tmp_path)
    other = merge(cfg, {"data": {"remainder": "drop"}})  # the views were packed under another policy
    fails(["hf/train", "remainder"], lambda: run_verify(store, views, other, tmp_path))


@pytest.mark.parametrize(
    "fmt, split, key, value",
    [
        ("hf", "train", "rows", 999),
        ("hf", "train", "dropped_tokens", 0),
        ("hf", "val", "tokens_packed", 123456),
        ("litgpt", "train", "file_pad_tokens", 7),
        ("megatron", "val", "tokens", 5),
        ("hf", None, "tokenizer_sha256", "0" * 64),
        ("litgpt", None, "fingerprint", "0" * 64),
        ("megatron", None, "store_fingerprint", None),
    ],
)
def test_view_json_counts_and_identity_are_checked(store, tmp_path, fmt, split, key, value):
    """What view.json says (rows and token counts copied into stats.json, the fingerprint training resumes
    on, the tokenizer evaluate checks) must be what the view and its store hold."""
    cfg = config(store)
    (view,) = build(store, tmp_path, cfg, fmts=(fmt,))
    run_verify(store, [view], cfg, tmp_path)  # passes as written
    info = json.loads((view / "view.json").read_text())
    assert (info[split] if split else info).get(key) != value
    (info[split] if split else info)[key] = value
    (view / "view.json").write_text(json.dumps(info))
    where = f"{fmt}/{split}" if split else re.escape(f"{view}/view.json")
    fails([where, key], lambda: run_verify(store, [view], cfg, tmp_path))


@pytest.mark.parametrize("change", ["repeat", "swap", "both_splits"])
def test_doc_ids_out_of_place_are_caught(store, tmp_path, change):
    """doc_ids are not under the shards' sha256 (tokens are): a document id repeated, two swapped, or one
    in both splits of a shard (a tokenize bug, a hand edit) is named, not passed (nor a KeyError later)."""
    tokens, shard, header = copied_shard(store, tmp_path)
    raw = bytearray(shard.read_bytes())
    from safetensors import safe_open

    with safe_open(str(shard), framework="numpy") as f:
        train, val = f.get_tensor("train.doc_ids"), f.get_tensor("val.doc_ids")
    assert train.size > 2 and val.size >= 1 and train.dtype == np.int64 and header["train.doc_ids"]["dtype"] == "I64"
    a_train, a_val = (header[f"{s}.doc_ids"]["at"] for s in ("train", "val"))
    if change == "repeat":
        raw[a_train + 8 : a_train + 16] = train[:1].astype("<i8").tobytes()
    elif change == "swap":
        raw[a_train : a_train + 16] = train[1::-1].astype("<i8").tobytes()
    else:
        raw[a_val : a_val + 8] = train[:1].astype("<i8").tobytes()
    shard.write_bytes(bytes(raw))
    cfg = config(store)
    want = ["doc_ids: document 1 .* repeats or is out of place"] if change != "both_splits" else ["is in both train and val"]
    fails([re.escape(str(shard)), *want], lambda: run_verify(store, [], cfg, tmp_path, manifest=tokens / "manifest.json"))


@pytest.mark.parametrize("cut", [1, 100])
def test_cut_hf_file_is_named(store, tmp_path, cut):
    """An hf view file cut short (a full disk, a killed copy): a VerifyError naming the file, not pyarrow's
    own error naming none."""
    cfg = config(store)
    (view,) = build(store, tmp_path, cfg, fmts=("hf",))
    path = sorted((view / "train").glob("*.arrow"))[0]
    path.write_bytes(path.read_bytes()[:-cut])
    fails([re.escape(str(path)), "unreadable after row"], lambda: run_verify(store, [view], cfg, tmp_path))


@pytest.mark.parametrize("key", ["read", "by_source"])
def test_manifest_counts_are_checked_against_the_shards(store, tmp_path, key):
    """stats.json, the report and the model card copy the manifest's read stats and per-source counts:
    verify recomputes them from the shards (a hand-edited or stale manifest was passed as it was)."""
    tokens = tmp_path / "tokens"
    shutil.copytree(store["tokens"], tokens)
    manifest = json.loads((tokens / "manifest.json").read_text())
    if key == "read":
        manifest["read"]["documents"] += 999
    else:
        manifest["by_source"]["0"]["train"]["tokens"] += 12345
    (tokens / "manifest.json").write_text(json.dumps(manifest))
    cfg = config(store)
    fails([f"{key} .* differs from its shards'"], lambda: run_verify(store, [], cfg, tmp_path, manifest=tokens / "manifest.json"))


@pytest.mark.parametrize("fmt", ["hf", "litgpt", "megatron"])
def test_a_view_holding_a_file_it_does_not_write_fails(store, tmp_path, fmt):
    """A view folder is one job's output: a file it does not write (a copy, a temp file of another writer)
    is named, not hashed into stats.json as part of the view."""
    cfg = config(store)
    (view,) = build(store, tmp_path, cfg, fmts=(fmt,))
    (view / ".snakemake_timestamp").touch()  # Snakemake's own mark in a directory() output
    run_verify(store, [view], cfg, tmp_path)  # passes as written
    (view / "notes.txt").write_text("not the view's")
    fails([re.escape(str(view)), "notes.txt"], lambda: run_verify(store, [view], cfg, tmp_path))


def test_store_files_the_manifest_does_not_name_are_listed_apart(store, tmp_path):
    """Shards of an earlier job grouping (data.shards_per_job changed: Snakemake leaves the old job folders)
    are not the store: stats.json hashes the manifest, its shards and their jobs' read.json only, and
    lists the rest as stray."""
    tokens, shard, _ = copied_shard(store, tmp_path)
    (tokens / "job-old").mkdir()
    shutil.copy(shard, tokens / "job-old" / "shard-00000.safetensors")
    (tokens / "notes.txt").write_text("x")
    (tokens / ".snakemake_timestamp").touch()
    cfg = config(store)
    stats = run_verify(store, [], cfg, tmp_path, manifest=tokens / "manifest.json")
    manifest = json.loads((tokens / "manifest.json").read_text())
    want = {str(tokens / "manifest.json"), *(str(tokens / e["file"]) for e in manifest["shards"])}
    assert want <= set(stats["files"])
    assert not {f for f in stats["files"] if "job-old" in f or f.endswith("notes.txt")}
    assert stats["stray"] == sorted([str(tokens / "job-old" / "shard-00000.safetensors"), str(tokens / "notes.txt")])
