"""Shared fixtures: a small slice of the shipped corpus, tiny configs, a prepared data view."""

from __future__ import annotations

import copy
import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

from llmpipe import config as cfgmod

# The suite runs two files at a time (README "Tests"). OpenMP threads of a torch step then yield the core
# the other file's processes hold instead of spinning on it (the embedded default end to end: 219 s alone;
# 840 s in a two-worker run, spinning; 324 s beside test_train_trust.py, passive). Inherited by every
# process a test starts, Slurm jobs included (sbatch exports the environment).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The longest files first (by their seconds in a two-worker run), so that the shorter ones fill the other worker beside
# them; the rest keep their order. A stale list only costs balance, never a test.
LONGEST_FILES = (
    "test_slurm.py",
    "test_workflow.py",
    "test_benchmarks.py",
    "test_train_trust.py",
    "test_levanter.py",
    "test_torch_fsdp.py",
    "test_colossal.py",
    "test_train_torch.py",
    "test_trainer_lock.py",
    "test_profiles.py",
    "test_reliability_pipeline.py",
    "test_declared_inputs.py",
    "test_sagemaker.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's order is kept


REPO = Path(__file__).resolve().parents[1]
# What a test's copy of the checkout leaves out: outputs, caches and the backend venvs (GBs).
REPO_IGNORE = shutil.ignore_patterns(
    "results",
    ".snakemake",
    ".git",
    ".venvs",
    "__pycache__",
    "*.egg-info",
    ".pytest_cache",
    ".hypothesis",
    ".benchmarks",
    ".ruff_cache",
    "report.html",
)
CORPUS = REPO / "data" / "gutenberg-sample-2mb.jsonl.gz"
GPT2 = REPO / "data" / "tokenizers" / "gpt2"
SHARED_DATA = REPO.parent / "shared" / "data"


def corpus_docs(n: int) -> list[str]:
    docs = []
    with gzip.open(CORPUS, "rt", encoding="utf-8") as fh:
        for line in fh:
            docs.append(json.loads(line)["text"])
            if len(docs) == n:
                break
    return docs


def merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def tiny_config(tmp: Path, **sections) -> dict:
    """A validated config for a seconds-long run on `tmp`/corpus.jsonl."""
    base = {
        "run": "t",
        "results_dir": str(tmp / "results"),
        "data": {"sources": [str(tmp / "corpus.jsonl")], "num_shards": 2, "val_fraction": 0.1},
        "tokenizer": {"source": "train", "vocab_size": 512},
        "model": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        },
        "train": {
            "seq_len": 64,
            "global_batch_size": 8,
            "micro_batch_size": 2,
            "lr": 3e-3,
            "min_lr": 3e-4,
            "warmup_steps": 2,
            "max_steps": 12,
            "save_interval": 4,
            "eval_interval": 6,
            "seed": 7,
            "threads": 1,
        },
    }
    return cfgmod.validate(merge(base, sections), whole=False)  # backend checks: tested on their own


def torch_train_args(cfg, init, view, ckpt, metrics, final) -> list[str]:
    """`llmpipe torch-train` arguments (cfg: a dict, or JSON text as it is)."""
    text = cfg if isinstance(cfg, str) else json.dumps(cfg)
    paths = {"--init": init, "--data": view, "--checkpoints": ckpt, "--metrics": metrics, "--out": final}
    return ["torch-train", "--config", text, *(x for flag, path in paths.items() for x in (flag, str(path)))]


def write_jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def gpt2_shard_inputs(tmp: Path, docs: list[str], backend: str = "auto") -> tuple[dict, list]:
    """(config, sources) for tokenize_shard of `docs` as one shard with the GPT-2 tokenizer."""
    from llmpipe.data.get_data import get_data, load_sources

    write_jsonl(tmp / "corpus.jsonl", docs)
    cfg = tiny_config(tmp, tokenizer={"source": str(GPT2), "backend": backend}, data={"num_shards": 1})
    get_data(cfg["data"], tmp / "sources.json")
    return cfg, load_sources(tmp / "sources.json")


def prepare(tmp: Path, cfg: dict, views=("hf",)) -> dict:
    """Data stages through their module functions: sources, tokenizer, token store, views."""
    from llmpipe.data.get_data import get_data, load_sources
    from llmpipe.data.pack_views import build_view
    from llmpipe.data.readers import SOURCE_HASHES
    from llmpipe.data.token_store import build_manifest, merge_checksums
    from llmpipe.data.tokenize import source_checksums, tokenize_shard
    from llmpipe.data.tokenizer import copy_tokenizer, train_tokenizer

    d, t = cfg["data"], cfg["tokenizer"]
    key = get_data(d, tmp / "sources.json")["key"]
    sources = load_sources(tmp / "sources.json")
    if t["source"] == "train":
        train_tokenizer(d, sources, tmp / "tokenizer", t["vocab_size"], t["min_frequency"], t["max_train_documents"])
    else:
        copy_tokenizer(t["source"], tmp / "tokenizer")
    tokens = tmp / "tokens"
    outs = [tokens / f"shard-{i:05d}.safetensors" for i in range(d["num_shards"])]
    SOURCE_HASHES.clear()
    for i, o in enumerate(outs):
        tokenize_shard(cfg, sources, i, tmp / "tokenizer", o, sources_key=key)
    # the sources' sha256, from what these one-shard jobs read (as a tokenize job writes them to read.json)
    entries = json.loads((tmp / "sources.json").read_text())["sources"]
    sums = merge_checksums([(source_checksums(d, sources, entries, range(len(outs))), "prepare")], entries)
    build_manifest(outs, tokens / "manifest.json", key, checksums=sums)
    for fmt in views:
        build_view(tokens / "manifest.json", fmt, tmp / fmt, cfg, tmp / "tokenizer")
    return {
        "root": tmp,
        "cfg": cfg,
        "sources": sources,
        "tokens": tokens,
        "manifest": tokens / "manifest.json",
        "view": tmp / "hf",
        "tokenizer": tmp / "tokenizer",
    }


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    from llmpipe.model.init import init_model

    tmp = tmp_path_factory.mktemp("prepared")
    write_jsonl(tmp / "corpus.jsonl", corpus_docs(60))
    cfg = tiny_config(tmp)
    out = prepare(tmp, cfg, views=("hf", "litgpt"))
    init_model(cfg, tmp / "tokenizer", tmp / "init")
    return {**out, "init": tmp / "init", "litgpt": tmp / "litgpt"}


def big_llama(folder: Path, dtype: str = "float32", seq_len: int = 2048) -> tuple[int, int]:
    """A 16-layer Llama of 87 M parameters (349 MB in float32; its largest tensors, the 32000-row embedding and
    head, 66 MB in float32) saved by save_pretrained in `dtype`, for the memory tests of the tensor-by-tensor
    copies: (parameters, bytes of its largest tensor in float32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    conf = LlamaConfig(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=16,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=seq_len,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(conf).to(getattr(torch, dtype))
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters()), max(p.numel() for p in model.parameters()) * 4


def peak_growth(script: str, *args: str) -> int:
    """Bytes a fresh Python process running `script` (with `args`) grew over the RSS it had when the script reset
    its peak: the script prints {"base_kb": VmRSS then, "peak_kb": VmHWM at the end} as its last line."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    return (got["peak_kb"] - got["base_kb"]) * 1024
