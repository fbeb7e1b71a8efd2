"""The command line every trainer we own shares (llmpipe train, llmpipe train-colossal)."""

from __future__ import annotations

import argparse


def trainer_parser(prog: str, doc: str | None, tokenizer: bool = False) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--init", required=True, help="initial HF checkpoint folder")
    p.add_argument("--data", required=True, help="hf view folder (train/, val/, view.json)")
    if tokenizer:
        p.add_argument("--tokenizer", default=None, help="tokenizer folder copied into --out")
    p.add_argument("--checkpoints", required=True, help="folder for resumable step_* checkpoints")
    p.add_argument("--metrics", required=True, help="metrics.jsonl path")
    p.add_argument("--out", required=True, help="final HF-format model folder")
    p.add_argument(
        "--stop-after", type=int, default=None, help="checkpoint after this step and exit without --out (as if preempted)"
    )
    return p
