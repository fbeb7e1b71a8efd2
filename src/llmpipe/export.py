"""export: a trained HF-format checkpoint -> <run>/hf/ (safetensors + config + tokenizer), in export.dtype."""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path

import torch

from llmpipe import config as cfgmod
from llmpipe.data import stfile
from llmpipe.data.tokenizer import TokenizerMismatch, check_same_tokenizer, copy_tokenizer_files, load_tokenizer
from llmpipe.io import atomic_path
from llmpipe.model.folder import FolderError, model_folder, tokenizer_folder
from llmpipe.model.hf_compat import legacy_readable
from llmpipe.model.safetensors_out import (
    DTYPES,
    MAX_FILE_BYTES,
    READ_DTYPES,
    map_large_allocations,
    not_weight,
    plan_files,
    write_index,
    write_safetensors,
)

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


def weight_files(folder: Path) -> list[Path] | None:
    """The safetensors files of an HF model folder (its index's, or model.safetensors); None: .bin weights."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return sorted({folder / f for f in json.loads(index.read_text())["weight_map"].values()})
    return [folder / "model.safetensors"] if (folder / "model.safetensors").is_file() else None


def tensors_of(files: list[Path], skip) -> dict[str, tuple[Path, int, str, tuple]]:
    """name -> (file, data offset, safetensors dtype, shape) of each tensor, from the files' headers only. A name
    the file's metadata maps to a tensor it holds (safetensors' save_model keeps one name of tied weights, the
    first in sorted order: a tied Llama's lm_head.weight, its embedding's name left in the metadata) reads
    that tensor."""
    out = {}
    for path in files:
        header, base = stfile.header(path)
        meta = header.get("__metadata__") or {}
        aliases = {name: kept for name, kept in meta.items() if name not in header and kept in header and kept != "__metadata__"}
        for name, info in [*header.items(), *((a, header[kept]) for a, kept in aliases.items())]:
            if name != "__metadata__" and not skip(name) and name not in out:
                if info["dtype"] not in READ_DTYPES:
                    raise ValueError(f"{path}: tensor {name} is {info['dtype']}, not a float weight")
                out[name] = (path, base + info["data_offsets"][0], info["dtype"], tuple(info["shape"]))
    return out


def read_tensor(path: Path, at: int, st_dtype: str, shape: tuple) -> torch.Tensor:
    """One tensor, read with pread (no memory map: mapped pages would stay in RSS)."""
    dtype = READ_DTYPES[st_dtype]
    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    buf = bytearray(n)
    with open(path, "rb") as fh:
        fh.seek(at)
        if fh.readinto(buf) != n:
            raise ValueError(f"{path}: cut short (tensor at byte {at})")
    return torch.frombuffer(buf, dtype=dtype).reshape(shape) if n else torch.empty(shape, dtype=dtype)


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
    torch_dtype, bad = DTYPES[dtype], []

    def fill(name):
        def put(t: torch.Tensor) -> None:
            t.copy_(read_tensor(*found[name]))  # cast as copied: no third copy
            if not torch.isfinite(t).all():
                bad.append(name)

        return put

    map_large_allocations()
    plan = plan_files([(name, info[3]) for name, info in found.items()], torch_dtype, MAX_FILE_BYTES)
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        entries = ((name, fill(name)) for name in found)
        for fname, planned in plan.items():
            write_safetensors(tmp / fname, planned, entries, torch_dtype)
        refuse_non_finite(trained, bad)
        write_index(tmp, plan, torch_dtype)
        config.dtype = torch_dtype
        config.save_pretrained(str(tmp))
        generation_config(trained, config).save_pretrained(str(tmp))
        copy_tokenizer_files(tokenizer_dir, tmp)
        legacy_readable(tmp)  # transformers 4.x readers get the same RoPE and a tokenizer class they have
    count = sum(math.prod(info[3]) for info in found.values())
    log.info("exported %s -> %s (%s, %d parameters, %d file(s))", trained, out_dir, dtype, count, len(plan))


def generation_config(trained: str, config):
    """The trained folder's generation_config.json, else the one transformers derives from its config."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(trained, local_files_only=True)
    except OSError:
        return GenerationConfig.from_model_config(config)


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
