"""Tokenizer stage: train a small byte-level BPE, or copy a local HF tokenizer folder; load it."""

from __future__ import annotations

import argparse
import hashlib
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pyarrow.parquet as pq

from llmpipe import config as cfgmod
from llmpipe.io import atomic_path

log = logging.getLogger(__name__)

EOS = "<|endoftext|>"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "LICENSE")


@dataclass(frozen=True)
class TokenizerInfo:
    """What the data stages need to know about a tokenizer."""

    eos_id: int
    bos_id: int | None
    adds_bos: bool  # the tokenizer prepends BOS itself when encoding with special tokens
    vocab_size: int  # len(tokenizer), special tokens included
    sha256: str  # of tokenizer.json: the token store refuses to mix tokenizers


def _train_texts(shards: list[Path]) -> Iterator[list[str]]:
    for shard in shards:
        for batch in pq.ParquetFile(shard).iter_batches(columns=["split", "text"], batch_size=1024):
            rows = batch.to_pydict()
            yield [t for s, t in zip(rows["split"], rows["text"]) if s == "train"]


def train_tokenizer(shards: list[Path], out_dir: str | Path, vocab_size: int, min_frequency: int) -> None:
    """Byte-level BPE (GPT-2 style pre-tokenizer) trained on the train split only."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_train_texts(shards), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, unk_token=None)
    with atomic_path(out_dir) as tmp:
        fast.save_pretrained(str(tmp))
    log.info("trained byte-level BPE: %d tokens -> %s", tok.get_vocab_size(), out_dir)


def copy_tokenizer(src: str | Path, out_dir: str | Path) -> None:
    src = Path(src)
    if not (src / "tokenizer.json").is_file():
        raise FileNotFoundError(f"tokenizer.source {src} has no tokenizer.json (a local HF tokenizer folder is needed)")
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        for name in TOKENIZER_FILES:
            if (src / name).is_file():
                shutil.copy2(src / name, tmp / name)
    load_tokenizer(out_dir)  # fail here, not in a later job, if transformers cannot load it


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)


def tokenizer_info(path: str | Path, tok=None) -> TokenizerInfo:
    tok = tok if tok is not None else load_tokenizer(path)
    if tok.eos_token_id is None:
        raise ValueError(f"tokenizer {path} has no eos_token: one is needed to separate documents")
    probe = tok("a", add_special_tokens=True)["input_ids"]
    adds_bos = tok.bos_token_id is not None and tok.bos_token_id != tok.eos_token_id and probe[:1] == [tok.bos_token_id]
    sha = hashlib.sha256((Path(path) / "tokenizer.json").read_bytes()).hexdigest()
    return TokenizerInfo(tok.eos_token_id, tok.bos_token_id, adds_bos, len(tok), sha)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe tokenizer", description=__doc__)
    p.add_argument("--config", required=True)
    p.add_argument("--shards", nargs="*", default=[], help="raw Parquet shards (to train on)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    cfg = cfgmod.load(args.config)["tokenizer"]
    if cfg["source"] == "train":
        if not args.shards:
            p.error("tokenizer.source is 'train': pass --shards")
        train_tokenizer([Path(s) for s in args.shards], args.out, cfg["vocab_size"], cfg["min_frequency"])
    else:
        copy_tokenizer(cfg["source"], args.out)
