"""export: a trained HF-format checkpoint -> <run>/hf/ (safetensors + config + tokenizer), in export.dtype."""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path

import torch

from llmpipe import config as cfgmod
from llmpipe.data.tokenizer import TokenizerMismatch, check_same_tokenizer, copy_tokenizer_files, load_tokenizer
from llmpipe.io import atomic_path
from llmpipe.model.folder import FolderError, model_folder, tokenizer_folder
from llmpipe.model.hf_compat import legacy_readable
from llmpipe.model.safetensors_out import DTYPES, not_weight
from llmpipe.model.weights import copy_weights, generation_config, tensors_of, weight_files

log = logging.getLogger(__name__)
EMBEDDING = "model.embed_tokens.weight"  # a Llama-family model's input embedding


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
    """Tensor by tensor (safetensors in, one tensor in memory at a time: a 70B exports in bounded memory);
    .bin weights through transformers, the whole model in memory."""
    from transformers import AutoConfig

    trained, tokenizer_dir = model_folder(trained, "--trained"), tokenizer_folder(tokenizer_dir, "--tokenizer")
    check_tokenizer(trained, tokenizer_dir, manifest)
    files = weight_files(Path(trained))
    if files is None:
        return export_whole(trained, tokenizer_dir, out_dir, dtype)
    config = AutoConfig.from_pretrained(trained, trust_remote_code=False, local_files_only=True)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    found = tensors_of(files, lambda n: not_weight(n) or (tied and n == "lm_head.weight"))
    if tied and EMBEDDING not in found:  # written without it, the tied model would load a random embedding
        raise SystemExit(f"llmpipe export: --trained {trained} ties its embeddings but holds no {EMBEDDING} (nor a name for it)")
    rows = found[EMBEDDING][3][0] if EMBEDDING in found else config.vocab_size
    check_rows(rows, len(load_tokenizer(tokenizer_dir)), tokenizer_dir, trained)
    torch_dtype = DTYPES[dtype]
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        files_written, bad = copy_weights(found, tmp, torch_dtype)
        refuse_non_finite(trained, bad)
        config.dtype = torch_dtype
        config.save_pretrained(str(tmp))
        generation_config(trained).save_pretrained(str(tmp))
        copy_tokenizer_files(tokenizer_dir, tmp)
        legacy_readable(tmp)  # transformers 4.x readers get the same RoPE and a tokenizer class they have
    count = sum(math.prod(info[3]) for info in found.values())
    log.info("exported %s -> %s (%s, %d parameters, %d file(s))", trained, out_dir, dtype, count, files_written)


def check_rows(rows: int, entries: int, tokenizer_dir, trained) -> None:
    if rows < entries:
        raise SystemExit(
            f"llmpipe export: --tokenizer {tokenizer_dir} has {entries} entries, more than the {rows} embedding rows of "
            f"--trained {trained}: not the tokenizer it was trained with"
        )


def refuse_non_finite(trained, bad: list[str]) -> None:
    if bad:
        raise SystemExit(
            f"llmpipe export: {trained} has non-finite weights in {', '.join(bad[:5])}"
            f"{f' (+{len(bad) - 5} more)' if len(bad) > 5 else ''}: refusing to export a damaged model"
        )


def export_whole(trained: str, tokenizer_dir: Path, out_dir: str | Path, dtype: str) -> None:
    """A folder of .bin weights: through transformers, the whole model in memory."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(trained, dtype=torch.float32, trust_remote_code=False, local_files_only=True)
    model = model.to(DTYPES[dtype])
    refuse_non_finite(
        trained, [n for n, t in model.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()]
    )
    check_rows(model.get_input_embeddings().weight.shape[0], len(load_tokenizer(tokenizer_dir)), tokenizer_dir, trained)
    with atomic_path(out_dir) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        copy_tokenizer_files(tokenizer_dir, tmp)
        legacy_readable(tmp)
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
