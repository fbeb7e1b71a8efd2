"""llmpipe plan: the config in, the best inputs found (given paths, this run's outputs, else estimates),
plan.json / plan.md / the steps overlay out."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import yaml

from llmpipe import config as cfgmod
from llmpipe.data.mixture import paths
from llmpipe.data.readers import HF_PREFIX, _compression
from llmpipe.data.sources import expand_sources
from llmpipe.data.tokenize import num_jobs
from llmpipe.io import atomic_path, write_json
from llmpipe.plan import __doc__ as PLAN_DOC
from llmpipe.plan.arithmetic import Shape, parameters
from llmpipe.plan.hardware import load_hardware
from llmpipe.plan.inputs import (
    checkpoint_parameters,
    data_from_store,
    data_from_view,
    rows_for,
    run_outputs,
    shape_from_config,
    tokenizer_folder,
)
from llmpipe.plan.make import make_plan, time_limit_warnings
from llmpipe.plan.render import markdown
from llmpipe.plan.tokens import estimate as estimate_tokens
from llmpipe.profiles import merge

log = logging.getLogger(__name__)


def load_configs(sources: list[str]) -> dict:
    """Config files (or inline JSON) merged in order like snakemake --configfile, then validated."""
    merged: dict = {}
    for src in sources:
        text = str(src)
        if text.lstrip().startswith("{"):
            data = json.loads(text)
        else:
            if not Path(text).is_file():
                raise cfgmod.ConfigError(f"config file not found: {text}")
            data = yaml.safe_load(Path(text).read_text()) or {}
        merged = merge(merged, data)
    return cfgmod.validate(merged)


def build(
    cfg: dict,
    view: Path | None = None,
    store: Path | None = None,
    model: Path | None = None,
    estimate: bool = False,
    allow_unknown_data: bool = False,
    limit: dict | None = None,
) -> dict:
    """The plan from the best inputs available: given paths, else this run's matching outputs, else estimates.
    allow_unknown_data: without a tokenizer to estimate with (a base model not downloaded yet), plan the
    steps of train.max_steps / plan.tokens with the data's size unknown instead of failing."""
    hardware = load_hardware(cfg["plan"])  # first: a typo there should not wait for an estimate
    explicit = view is not None and model is not None
    found = {"tokenizer": None} if explicit else run_outputs(cfg)
    if not estimate and not explicit:
        view, store, model = view or found["view"], store or found["store"], model or found["model"]
    tok_dir = found["tokenizer"] if cfg["tokenizer"]["source"] == "train" else tokenizer_folder(cfg)
    if view is not None:
        data = data_from_view(Path(view), cfg["train"]["seq_len"])
    elif store is not None:
        data = data_from_store(Path(store), cfg)
    elif cfg["tokenizer"]["source"] != "train" and (tok_dir is None or not Path(tok_dir).is_dir()):
        # another tokenizer would give another count: plan the configured steps, data size unknown
        why = f"tokenizer {cfg['tokenizer']['source']} not available yet (run the tokenizer stage for a count)"
        if not allow_unknown_data:
            raise ValueError(why)
        data = {"source": why + "; steps from the config", "train_rows": None, "tokens_per_epoch": None, "val_tokens": None}
    else:
        est = estimate_tokens(cfg, tok_dir)
        rows = rows_for(est["train_tokens"], cfg["train"]["seq_len"], cfg["data"]["remainder"])
        data = {
            "source": "estimate",
            "train_rows": rows,
            "tokens_per_epoch": rows * cfg["train"]["seq_len"],
            "val_tokens": est["val_tokens"],
            "estimate": est,
        }
    if model is not None:
        model = Path(model)
        folder = model if model.is_dir() else model.parent
        shape, source = Shape.from_hf(json.loads((folder / "config.json").read_text())), str(folder / "config.json")
        counted = checkpoint_parameters(folder)
    else:
        shape, source = shape_from_config(cfg, tok_dir)
        counted = None
    n_params = counted if counted is not None else parameters(shape)
    if counted is not None and counted != parameters(shape):
        log.warning(
            "%s holds %d parameters, the Llama formula gives %d: using the checkpoint's count", source, counted, parameters(shape)
        )
    plan = make_plan(cfg, shape, n_params, data, hardware, source)
    plan["time_limit"] = limit
    if limit:
        plan["warnings"].extend(time_limit_warnings(cfg, plan, limit))
    if warning := decompress_warning(cfg["data"]):
        plan["warnings"].append(warning)
    return plan


def decompress_warning(d: dict) -> str | None:
    """With fewer sources than data.num_shards every shard reads every source; spread over several
    tokenize jobs (data.shards_per_job set), a compressed one (no byte ranges to skip to) is
    decompressed whole by every job. Null keeps them in one job that reads each source once."""

    try:
        sources = expand_sources(paths(d["sources"]))
    except (OSError, ValueError):  # not there yet: get-data names it
        return None
    packed = [s for s in sources if not s.startswith(HF_PREFIX) and _compression(s)]
    jobs = num_jobs(d, len(sources))
    if not packed or len(sources) >= d["num_shards"] or jobs == 1:
        return None
    return (
        f"{len(sources)} source(s) for data.num_shards {d['num_shards']} in {jobs} tokenize jobs (data.shards_per_job "
        f"{d['shards_per_job']}): each job decompresses all of {', '.join(packed[:3])}{' ...' if len(packed) > 3 else ''}; "
        f"leave data.shards_per_job null (one job reads each source once) or split the corpus into at least {jobs} "
        "files (docs/data.md, Sharding)"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="llmpipe plan", description=PLAN_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", required=True, help="config file or inline JSON; repeat to overlay")
    p.add_argument("--view", help="packed hf view folder (view.json: counted tokens); default: this run's, if built")
    p.add_argument(
        "--store", help="token store manifest.json or its folder (counted before packing); default: this run's, if built"
    )
    p.add_argument("--model", help="HF model folder or config.json; default: this run's checkpoints/init, if built")
    p.add_argument("--estimate", action="store_true", help="ignore this run's outputs: estimate tokens from the corpus")
    p.add_argument("--out", help="plan.json to write")
    p.add_argument("--markdown", help="plan.md (the table) to write")
    p.add_argument("--overlay", help="write the train.max_steps / warmup_steps overlay the plan derived (YAML)")
    p.add_argument("--time-limit", type=float, help="minutes a training job may run (Slurm: its runtime); warn above")
    p.add_argument("--attempts", type=int, default=1, help="with --time-limit: the training rule's attempts (retries + 1)")
    p.add_argument("--train-rule", default="the training job", help="with --time-limit: the training rule's name")
    args = p.parse_args(argv)
    if args.time_limit is not None and (args.time_limit <= 0 or args.attempts < 1):
        p.error("--time-limit must be > 0 minutes and --attempts >= 1")
    limit = {"rule": args.train_rule, "minutes": args.time_limit, "attempts": args.attempts} if args.time_limit else None
    try:
        cfg = load_configs(args.config)
        plan = build(cfg, args.view, args.store, args.model, args.estimate, allow_unknown_data=True, limit=limit)
    except (cfgmod.ConfigError, ValueError, OSError) as exc:
        raise SystemExit(f"llmpipe plan: {exc}") from None
    text = markdown(plan)
    for w in plan["warnings"]:
        log.warning("%s", w)
    if args.out:
        write_json(args.out, plan)
    if args.markdown:
        with atomic_path(args.markdown) as tmp:
            tmp.write_text(text)
    if args.overlay:
        with atomic_path(args.overlay) as tmp:
            tmp.write_text(yaml.safe_dump(plan["schedule"]["overlay"] or {}, sort_keys=False))
    print(text, end="")
