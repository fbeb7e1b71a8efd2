"""export: a trained HF-format checkpoint -> <run>/hf/ (safetensors + config + tokenizer), in export.dtype."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import torch

from llmpipe import config as cfgmod
from llmpipe.data.tokenizer import TokenizerMismatch, check_same_tokenizer, copy_tokenizer_files, load_tokenizer
from llmpipe.io import atomic_path
from llmpipe.model.folder import FolderError, model_folder, tokenizer_folder
from llmpipe.model.hf_compat import legacy_readable

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_tokenizer(trained: str | Path, tokenizer_dir: str | Path, manifest: str | Path | None) -> None:
    """The tokenizer shipped is the one the token store (and so the model) was made with; a tokenizer
    saved with the checkpoint must be that one too."""
    if manifest is None:
        return
    expected = json.loads(Path(manifest).read_text())["tokenizer"]["sha256"]
    check_same_tokenizer(tokenizer_dir, expected, f"the token store {manifest}")
    if (Path(trained) / "tokenizer.json").is_file():
        check_same_tokenizer(trained, expected, f"the token store {manifest}")


def export(
    trained: str | Path,
    tokenizer_dir: str | Path,
    out_dir: str | Path,
    dtype: str = "float32",
    manifest: str | Path | None = None,
) -> None:
    from transformers import AutoModelForCausalLM

    trained, tokenizer_dir = model_folder(trained, "--trained"), tokenizer_folder(tokenizer_dir, "--tokenizer")
    check_tokenizer(trained, tokenizer_dir, manifest)

    model = AutoModelForCausalLM.from_pretrained(trained, dtype=torch.float32, trust_remote_code=False, local_files_only=True)
    model = model.to(DTYPES[dtype])
    tok = load_tokenizer(tokenizer_dir)
    bad = [name for name, t in model.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        raise SystemExit(
            f"llmpipe export: {trained} has non-finite weights in {', '.join(bad[:5])}"
            f"{f' (+{len(bad) - 5} more)' if len(bad) > 5 else ''}: refusing to export a damaged model"
        )
    rows = model.get_input_embeddings().weight.shape[0]
    if rows < len(tok):
        raise SystemExit(
            f"llmpipe export: --tokenizer {tokenizer_dir} has {len(tok)} entries, more than the {rows} embedding rows of "
            f"--trained {trained}: not the tokenizer it was trained with"
        )
    with atomic_path(out_dir) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        copy_tokenizer_files(tokenizer_dir, tmp)
        legacy_readable(tmp)  # transformers 4.x readers get the same RoPE and a tokenizer class they have
    log.info("exported %s -> %s (%s, %d parameters)", trained, out_dir, dtype, model.num_parameters())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe export", description=__doc__)
    p.add_argument("--config", required=True)
    p.add_argument("--trained", required=True, help="HF-format folder the backend produced")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--manifest", help="token store manifest.json: the tokenizer must be the one it was made with")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        export(args.trained, args.tokenizer, args.out, cfgmod.load(args.config)["export"]["dtype"], args.manifest)
    except (TokenizerMismatch, FolderError) as exc:
        raise SystemExit(f"llmpipe export: {exc}") from None
