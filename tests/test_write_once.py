"""Files written once and read by a later step (every view's data files) leave the page cache as they are
written (llmpipe.io.WriteOnce): the bytes are those written, and a file many windows long keeps at most
about two windows cached. Token-store shards stay cached (`keep`): pack reads them right after.
Residency is read with util-linux's fincore."""

import os
import shutil
import subprocess

import numpy as np
import pytest

from llmpipe import io as llmio
from llmpipe.data import shard_set
from llmpipe.data.token_store import TokenStore
from llmpipe.data.tokenize import tokenize_shard
from llmpipe.data.views import hf, litgpt, megatron
from tests.conftest import GPT2, corpus_docs, gpt2_shard_inputs, prepare

WINDOW = 4096


def resident(path) -> int:
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES", str(path)], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[0])


@pytest.fixture
def small_window(tmp_path, monkeypatch):
    """A 4 KiB window; skipped where the page cache cannot be read or dropped (no fincore, not Linux, tmpfs)."""
    if shutil.which("fincore") is None or llmio._sync_file_range() is None:
        pytest.skip("needs Linux sync_file_range and util-linux fincore")
    probe = tmp_path / "probe"
    with open(probe, "wb") as fh:
        fh.write(bytes(1 << 20))
        fh.flush()
        os.fdatasync(fh.fileno())
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    if resident(probe):
        pytest.skip(f"{tmp_path}: this file system keeps written pages cached")
    probe.unlink()
    monkeypatch.setattr(llmio, "WRITE_BEHIND_WINDOW", WINDOW)


def test_write_once_keeps_the_bytes_and_two_windows_cached(tmp_path, small_window):
    rng = np.random.default_rng(0)
    pieces = [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in rng.integers(1, 3 * WINDOW, 400)]
    with llmio.WriteOnce(tmp_path / "out.bin") as fh:
        for p in pieces:
            assert fh.write(p) == len(p)
    data = b"".join(pieces)
    assert (tmp_path / "out.bin").read_bytes() == data
    # read back above: cached again; written again without reading, the tail alone stays
    with llmio.WriteOnce(tmp_path / "again.bin") as fh:
        for p in pieces:
            fh.write(memoryview(p))
    assert len(data) > 100 * WINDOW and resident(tmp_path / "again.bin") <= 2 * WINDOW + 3 * WINDOW + 4096
    with open(tmp_path / "plain.bin", "wb") as fh:  # the same bytes written plainly stay cached
        fh.write(data)
    assert resident(tmp_path / "plain.bin") >= len(data) // 2


def test_views_are_written_once_and_shards_kept_cached(tmp_path, small_window):
    """Checked right after each writer: the next step reads the file (and caches it again)."""
    cfg, sources = gpt2_shard_inputs(tmp_path, corpus_docs(60))
    cfg["data"]["litgpt_sequences_per_file"] = 4096  # one litgpt file of all its rows (> 20 windows)
    tokenize_shard(cfg, sources, 0, GPT2, tmp_path / "shard.safetensors")
    shard = tmp_path / "shard.safetensors"
    assert shard.stat().st_size >= 20 * WINDOW and resident(shard) >= shard.stat().st_size // 2  # pack reads it next
    written = {}
    (tmp_path / "prep").mkdir()
    store = prepare(tmp_path / "prep", cfg, views=())["manifest"]
    for name, module in (("hf", hf), ("litgpt", litgpt), ("megatron", megatron)):
        module.write(TokenStore(store), tmp_path / name, cfg)
        written[name] = [p for p in (tmp_path / name).rglob("*") if p.suffix in (".arrow", ".bin") and "val" not in str(p)]
    for kind, files in written.items():
        assert files, kind
        for f in files:
            size = f.stat().st_size
            assert size >= 20 * WINDOW and resident(f) <= size // 4, (kind, f.name, resident(f), size)


def test_shard_written_by_reopened_split_files_is_the_same(tmp_path, monkeypatch):
    """A process whose shards' split files would not fit its open-files limit reopens each to append,
    with write-behind windows passed on the way (no page-cache reading here: runs wherever the suite does)."""
    monkeypatch.setattr(llmio, "WRITE_BEHIND_WINDOW", WINDOW)
    cfg, sources = gpt2_shard_inputs(tmp_path, corpus_docs(60))
    tokenize_shard(cfg, sources, 0, GPT2, tmp_path / "kept-open.safetensors")
    monkeypatch.setattr(shard_set, "open_files_limit", lambda: 0)
    monkeypatch.setattr(shard_set, "BATCH_DOCS", 4)
    tokenize_shard(cfg, sources, 0, GPT2, tmp_path / "reopened.safetensors")
    assert (tmp_path / "reopened.safetensors").read_bytes() == (tmp_path / "kept-open.safetensors").read_bytes()
