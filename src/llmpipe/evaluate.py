"""evaluate: load the exported model with transformers, score the validation view -> eval.json."""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path

import torch

from llmpipe import backends
from llmpipe import config as cfgmod
from llmpipe.data.tokenizer import TokenizerMismatch, check_same_tokenizer
from llmpipe.io import write_json
from llmpipe.model.folder import FolderError, model_folder, view_folder
from llmpipe.model.streamed import available_bytes, float32_bytes, streamed_causal_lm
from llmpipe.train.documents import attention_kernel, masking_wanted
from llmpipe.train.loss import dataset_loss

log = logging.getLogger(__name__)


def evaluate(
    model_dir: str | Path,
    view_dir: str | Path,
    out: str | Path,
    batch_size: int,
    threads: int = 2,
    document_masking="auto",
    max_batches: int | None = None,
    stream_weights="auto",
) -> dict:
    """`document_masking`: train.document_masking; with segment_ids in the view (auto), each document of a
    packed row is scored on its own, as the torch trainer's val_loss is. `max_batches`: eval.final_max_batches
    (the split's first max_batches * batch_size rows; None: all). `stream_weights`: eval.stream_weights."""
    import datasets
    from transformers import AutoModelForCausalLM

    model_dir, view_dir = model_folder(model_dir, "--model"), view_folder(view_dir, "--data", ("val",))
    recorded = json.loads((view_dir / "view.json").read_text()).get("tokenizer_sha256")
    if recorded:  # the model's tokenizer is the one the scored tokens were made with
        if not (Path(model_dir) / "tokenizer.json").is_file():
            raise FolderError(
                f"--model {model_dir}: no tokenizer.json to check against the view's (score an exported model: llmpipe export)"
            )
        check_same_tokenizer(model_dir, recorded, f"the view {view_dir}")
    torch.set_num_threads(threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    val = datasets.load_from_disk(str(Path(view_dir) / "val")).with_format("torch")
    try:
        masking = masking_wanted(document_masking, val.column_names)
    except ValueError as exc:
        raise SystemExit(f"llmpipe evaluate: {exc}") from None
    attention = attention_kernel(device, masking)
    log.info("evaluate on %s: document masking %s, attention %s", device.type, "on" if masking else "off", attention)
    if streaming(stream_weights, model_dir, device):
        log.info("evaluate: weights streamed from %s module by module (eval.stream_weights %s)", model_dir, stream_weights)
        model = streamed_causal_lm(model_dir, device, attention)
    else:
        model = AutoModelForCausalLM.from_pretrained(
            model_dir,
            dtype=torch.float32,
            attn_implementation=attention,
            trust_remote_code=False,
            local_files_only=True,
        ).to(device)
    loss, tokens = dataset_loss(
        model, val, batch_size, device, progress="evaluate", document_masking=masking, max_batches=max_batches
    )
    if not math.isfinite(loss):
        raise SystemExit(
            f"llmpipe evaluate: validation loss of {model_dir} is {loss} (non-finite): the model is damaged; no eval.json written"
        )
    result = {
        "val_loss": loss,
        "perplexity": math.exp(loss) if loss <= 709.0 else math.inf,  # beyond a double: null in eval.json
        "tokens": tokens,
        "sequences": min(len(val), max_batches * batch_size) if max_batches else len(val),
        "split_sequences": len(val),
        "document_masking": masking,
        "model": str(model_dir),
        "data": str(Path(view_dir) / "val"),
    }
    write_json(out, result)
    log.info("eval: %s", result)
    return result


STREAM = {"auto": "auto", "true": True, "false": False}  # --stream-weights: eval.stream_weights's values


def streaming(setting, model_dir: Path, device: torch.device) -> bool:
    """eval.stream_weights: true, false, or auto (the float32 weights over half the memory there is)."""
    if setting != "auto":
        return bool(setting)
    need = float32_bytes(model_dir)
    have = available_bytes(device)
    return need is not None and have is not None and need > have // 2


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe evaluate", description=__doc__)
    p.add_argument("--config", required=True)
    p.add_argument("--model", required=True, help="HF model folder")
    p.add_argument("--data", required=True, help="hf view folder (its val/ split is scored)")
    p.add_argument("--out", required=True, help="eval.json")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--stream-weights", choices=STREAM, help="default: eval.stream_weights")
    args = p.parse_args(argv)
    try:
        cfg = cfgmod.load(args.config)
        # score packed rows the way the run's trainer trained on them (only some backends mask documents)
        masks = backends.get(cfg["train"]["backend"]).document_masking
        masking = cfg["train"]["document_masking"] if masks else False
        e = cfg["eval"]
        stream = e["stream_weights"] if args.stream_weights is None else STREAM[args.stream_weights]
        evaluate(args.model, args.data, args.out, e["batch_size"], args.threads, masking, e["final_max_batches"], stream)
    except (TokenizerMismatch, FolderError, ValueError) as exc:  # ValueError: a weight file's tensor not a float one
        raise SystemExit(f"llmpipe evaluate: {exc}") from None
