"""Tokenizer stage (train a byte-level BPE, or copy a local HF tokenizer folder or a Hub one), and the
tokenizer folder's facts (sha256, special tokens, vocab). The encoders built on it: data/encoders.py."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from llmpipe import config as cfgmod
from llmpipe.io import atomic_path

log = logging.getLogger(__name__)

EOS = "<|endoftext|>"
# what a tokenizer folder holds that we copy, download and ship (transformers 5 saves a chat template apart)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "LICENSE",
)


def _special(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


@dataclass(frozen=True)
class TokenizerInfo:
    """What the data stages need to know about a tokenizer."""

    eos_id: int
    bos_id: int | None
    adds_bos: bool  # the tokenizer prepends BOS itself when encoding with special tokens
    vocab_size: int  # special tokens included
    sha256: str  # of tokenizer.json: the token store refuses to mix tokenizers


def _file_key(path: str | Path) -> tuple:
    """tokenizer.json of a folder, by identity and stat: a process-level cache key (a tokenize job writes many
    shards with one tokenizer; loading it takes ~0.1 s and building the tiktoken ranks ~0.15 s)."""
    file = Path(path) / "tokenizer.json"
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no tokenizer.json (a local HF tokenizer folder is needed)")
    st = file.stat()
    return str(file.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


@functools.lru_cache(maxsize=4)
def _load_cached(key: tuple):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(key[0])


def load_backend(path: str | Path):
    """The tokenizers.Tokenizer of a folder (shared within a process while its tokenizer.json is unchanged)."""
    return _load_cached(_file_key(path))


def tokenizer_sha256(path: str | Path) -> str:
    """sha256 of a tokenizer folder's tokenizer.json: what the token store and its views are keyed by."""
    from llmpipe.io import sha256_file

    file = Path(path) / "tokenizer.json"
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no tokenizer.json (a local HF tokenizer folder is needed)")
    return sha256_file(file)


class TokenizerMismatch(ValueError):
    """A tokenizer folder is not the one the data (and so the model) was made with."""


def check_same_tokenizer(folder: str | Path, expected_sha256: str, made: str) -> None:
    """Refuse `folder` unless its tokenizer.json has the sha256 recorded when `made` was made."""
    got = tokenizer_sha256(folder)
    if got != expected_sha256:
        raise TokenizerMismatch(
            f"{folder}/tokenizer.json has sha256 {got}, but {made} was made with a tokenizer of sha256 "
            f"{expected_sha256}: the tokenizer changed after tokenizing. Restore the run's tokenizer, or rerun from "
            "it so data, model and export agree (snakemake --forcerun tokenizer)"
        )


def tokenizer_info(path: str | Path, tok=None) -> TokenizerInfo:
    """`tok`: the tokenizers.Tokenizer of `path`, if already loaded."""
    path = Path(path)
    tok = tok or load_backend(path)
    conf_file = path / "tokenizer_config.json"
    conf = json.loads(conf_file.read_text()) if conf_file.is_file() else {}
    eos, bos = _special(conf.get("eos_token")), _special(conf.get("bos_token"))
    eos_id = tok.token_to_id(eos) if eos else None
    if eos_id is None:
        raise ValueError(f"tokenizer {path} has no eos_token in tokenizer_config.json: one is needed to separate documents")
    bos_id = tok.token_to_id(bos) if bos else None
    probe = tok.encode("a", add_special_tokens=True).ids
    adds_bos = bos_id is not None and bos_id != eos_id and probe[:1] == [bos_id]
    return TokenizerInfo(eos_id, bos_id, adds_bos, tok.get_vocab_size(with_added_tokens=True), tokenizer_sha256(path))


def load_tokenizer(path: str | Path):
    """The transformers tokenizer of a folder's tokenizer.json as it is, the ids the data stages made (for
    model init). Not AutoTokenizer: transformers 5 rebuilds a model-specific class (LlamaTokenizer) from its
    vocab and merges, and drops a Llama-2 tokenizer.json's normalizer (" hello" gave other ids)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(path))


def copy_tokenizer_files(src: str | Path, out_dir: str | Path) -> None:
    """The tokenizer's files into a model folder byte for byte (a re-save rewrites tokenizer.json; its
    sha256 is what evaluate and export check)."""
    for name in TOKENIZER_FILES:
        if (Path(src) / name).is_file():
            shutil.copy2(Path(src) / name, Path(out_dir) / name)


# ---------------------------------------------------------------- tokenizer stage


def _train_texts(data_cfg: dict, sources: list[str], limit: int) -> Iterator[str]:
    from llmpipe.data.readers import ReadStats, documents
    from llmpipe.data.sources import ByteRange, is_validation

    stats = ReadStats()

    def gen():
        for s_idx, source in enumerate(sources):
            # a file cut into byte ranges: read as one range, so its documents' identity is the store's (offsets)
            part = ByteRange(0, source.size, source.size) if getattr(source, "ranges", None) else None
            for r_idx, text in documents(source, data_cfg, stats, part=part):
                if not is_validation(s_idx, r_idx, data_cfg["val_fraction"], data_cfg["split_seed"]):
                    yield text

    return islice(gen(), limit)


def train_tokenizer(
    data_cfg: dict, sources: list[str], out_dir: str | Path, vocab_size: int, min_frequency: int, max_documents: int
) -> None:
    """Byte-level BPE (GPT-2 pre-tokenizer) trained on train-split documents only."""
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
    tok.train_from_iterator(_train_texts(data_cfg, sources, max_documents), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, unk_token=None)
    with atomic_path(out_dir) as tmp:
        fast.save_pretrained(str(tmp))
    log.info("trained byte-level BPE: %d tokens -> %s", tok.get_vocab_size(), out_dir)


def copy_tokenizer(src: str | Path, out_dir: str | Path, provenance: dict | None = None) -> None:
    """`provenance`: written as hub.json beside the files (a Hub tokenizer's repo, revision, commit)."""
    from llmpipe.io import write_json

    src = Path(src)
    tok = load_backend(src)
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        copy_tokenizer_files(src, tmp)
        tokenizer_info(tmp, tok)  # fail here, not in a later job, if it lacks an EOS (tok: the same bytes)
        if provenance:
            write_json(tmp / "hub.json", provenance)


def download_tokenizer(ref: str, out_dir: str | Path, cache_dir: str | None = None, endpoint: str | None = None) -> dict:
    """A Hub tokenizer (org/name[@revision]): only its tokenizer files, through huggingface_hub's cache,
    then copied like a local folder, with hub.json recording the repo, revision and resolved commit."""
    from llmpipe.hub import HubError
    from llmpipe.hub.download import fetch_snapshot

    try:
        repo_id, rev, snapshot = fetch_snapshot(ref, list(TOKENIZER_FILES), cache_dir, endpoint, kind="tokenizer")
    except HubError as exc:
        raise HubError(f"tokenizer.source {ref!r} (not a local folder, so read as a Hub id): {exc}") from None
    if not (snapshot / "tokenizer.json").is_file():
        raise HubError(f"tokenizer.source {ref!r}: the repo has no tokenizer.json (a fast HF tokenizer file is needed)")
    record = {"source": "hub", "repo_id": repo_id, "revision": rev or "main", "commit": snapshot.name}
    copy_tokenizer(snapshot, out_dir, record)
    log.info("tokenizer %s -> %s (commit %s)", ref, out_dir, snapshot.name)
    return record


def main(argv: list[str] | None = None) -> None:
    from llmpipe.hub import is_hub_ref

    p = argparse.ArgumentParser(prog="llmpipe tokenizer", description=__doc__)
    p.add_argument("--config", required=True)
    p.add_argument("--sources", help="sources.json from get-data (to train on)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    cfg = cfgmod.load(args.config)
    t = cfg["tokenizer"]
    if t["source"] == "train":
        if not args.sources:
            p.error("tokenizer.source is 'train': pass --sources")
        from llmpipe.data.get_data import load_sources
        from llmpipe.data.readers import BadRecord, BadSource

        try:
            train_tokenizer(
                cfg["data"], load_sources(args.sources), args.out, t["vocab_size"], t["min_frequency"], t["max_train_documents"]
            )
        except (BadRecord, BadSource) as exc:  # one line naming the file and line, as tokenize gives it
            raise SystemExit(f"llmpipe tokenizer: error: {exc}") from None
    elif is_hub_ref(t["source"]):
        from llmpipe.hub import HubError

        try:
            download_tokenizer(t["source"], args.out, cfg["hub"]["cache_dir"], cfg["hub"]["endpoint"])
        except HubError as exc:
            raise SystemExit(f"llmpipe tokenizer: {exc}") from None
    else:
        copy_tokenizer(t["source"], args.out)
