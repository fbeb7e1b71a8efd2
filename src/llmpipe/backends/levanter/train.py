"""levanter-train: run `python -m levanter.main.train_lm` on a generated config, then put the final HF
export into the backend's `final/` folder. Runs in the Levanter environment.

- Resume: the config's trainer.id is fixed, so a rerun continues from the newest complete checkpoint
  under <output>/checkpoints/<id>/ (Levanter's own discovery); a finished run trains no step again;
  checkpoints made with other settings are refused (llmpipe-settings.json beside them). Under
  trainer.load_checkpoint false (train.resume false) the run restarts once: restart.json there marks it,
  so a retry goes on from the restart's checkpoints instead of starting over again.
- Config: --levanter-config runs a config.yaml as it is; --workdir writes it first (levanter-config's
  inputs), as the train_levanter rule does, so settings that do not change the model rerun nothing.
- Metrics: Levanter's json_logger lines (stdout/stderr) become <metrics> (metrics.jsonl, one line per
  step: step, loss, lr, tokens, tokens_per_s, epoch; val_loss at eval steps; grad_norm where Levanter
  logs it), merged with an interrupted run's. Levanter logs from its third step on.
- Final: Levanter writes an HF export at the last step (hf_save_steps = num_train_steps; final hooks are
  forced); it is copied to --out with train_summary.json. Steps here count from 1 (Levanter's step s is
  our s + 1), so the last one is train.max_steps.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import yaml

from llmpipe.backends.levanter import require_levanter
from llmpipe.io import atomic_path, write_json
from llmpipe.train.metrics import read_records, write_records
from llmpipe.train.resume import RESTART, init_sha256

log = logging.getLogger(__name__)

JSON_LINE = re.compile(r'levanter\.json_logger (\{"tracker": "json_logger".*\})\s*$')
RESUMED = re.compile(r"Loading checkpoint from (\S+)")
KEYS = {
    "train/loss": "loss",
    "optim/learning_rate": "lr",
    "throughput/total_tokens": "tokens",
    "throughput/tokens_per_second": "tokens_per_s",
    "eval/loss": "val_loss",
    "grad/norm/total": "grad_norm",
}
OFFLINE = {"WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


class LoggerRecords:
    """Per-step records from Levanter's json_logger lines, merged over an earlier (interrupted) run's
    metrics.jsonl; read and written through the shared llmpipe.train.metrics (atomic, strict JSON, a
    line cut short by a kill skipped)."""

    def __init__(self, path: Path | None, sequences_per_step: int = 0, train_sequences: int = 0):
        self.path, self.records, self._written = path, {}, 0.0
        self.per_step, self.train_sequences = sequences_per_step, train_sequences
        self.floor = 0  # steps up to here come from the checkpoint this run resumed from
        self.started = False  # a step's line was seen: a resume is announced before it
        if path:
            self.records = {rec["step"]: rec for rec in read_records(path)}

    def resumed(self, step: int) -> None:
        """Resumed after our step `step`: keep earlier records, drop later ones (they are trained again)."""
        self.floor = step
        self.records = {k: v for k, v in self.records.items() if k <= step}

    def add(self, line: str) -> None:
        m = JSON_LINE.search(line)
        if not m:
            return
        event = json.loads(m.group(1))
        if event.get("event") != "log" or event.get("step") is None:
            return
        step = int(event["step"]) + 1
        if not self.started:
            self.started = True
            if not self.floor:  # trained from the start: an earlier run's records are not this run's
                self.records = {}
        if step <= self.floor:
            return
        values = {KEYS[k]: v for k, v in event["metrics"].items() if k in KEYS and isinstance(v, (int, float))}
        if values:
            rec = self.records.setdefault(step, {"step": step})
            rec.update(values)
            if time.monotonic() - self._written > 2:
                self.write()

    def write(self) -> None:
        if not self.path:
            return
        recs = [r for _, r in sorted(self.records.items()) if "loss" in r and "lr" in r]
        for r in recs:
            if self.train_sequences:
                r["epoch"] = r["step"] * self.per_step / self.train_sequences
        write_records(self.path, recs, sort_keys=True)
        self._written = time.monotonic()


def latest_export(hf_root: str) -> tuple[str, int] | None:
    """The newest <hf_save_path>/<id>/step-N folder holding weights, and N."""
    fs, root = fsspec.core.url_to_fs(hf_root)
    best = None
    for d in fs.glob(f"{root}/step-*"):
        m = re.search(r"step-(\d+)$", d)
        if m and fs.glob(f"{d}/*.safetensors") and fs.exists(f"{d}/config.json"):
            if best is None or int(m.group(1)) > best[1]:
                best = (d, int(m.group(1)))
    return (fs.unstrip_protocol(best[0]) if "://" in hf_root else best[0], best[1]) if best else None


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


# Settings that may change between a checkpoint and its resume: paths, and when to save or evaluate.
NEUTRAL = {
    "trainer.log_dir",
    "trainer.checkpointer.base_path",
    "trainer.checkpointer.save_interval",
    "trainer.checkpointer.keep",
    "trainer.steps_per_eval",
    "trainer.per_device_parallelism",  # train.micro_batch_size: accumulation only (RESUME_NEUTRAL)
    "trainer.per_device_eval_parallelism",
    "trainer.max_eval_batches",
    "trainer.load_checkpoint",
    "model.tokenizer",
    "model.reference_checkpoint",
    "initialize_from_hf",
    "hf_save_path",
    "data.tokenizer",
    "data.cache_dir",
    "data.components.llmpipe.cache_dir",
}
IDENTITY = ("llmpipe.data", "llmpipe.init_sha256")  # what was trained on, not settings


def cache_info(lev: dict) -> dict:
    """cache.json of the Levanter cache this config reads (levanter-cache: the store's fingerprint, token
    counts); {} before it exists."""
    info = Path(lev["data"]["cache_dir"]) / "cache.json"
    return json.loads(info.read_text()) if info.exists() else {}


def run_settings(lev: dict) -> dict:
    """What checkpoints must agree on: Levanter's settings (NEUTRAL and the tracker left out), the token
    store's fingerprint (cache.json) and, when continuing a model, its weights' digest."""
    want = {k: v for k, v in _flat(lev).items() if k not in NEUTRAL and not k.startswith("trainer.tracker")}
    want["llmpipe.data"] = cache_info(lev).get("fingerprint")
    if lev.get("initialize_from_hf"):
        want["llmpipe.init_sha256"] = init_sha256(Path(lev["initialize_from_hf"]))
    return want


def check_resume(lev: dict, want: dict | None = None) -> None:
    """Refuse to resume checkpoints trained with other settings (hyperparameters, model, data order) or on
    other data or another base model; paths, logging and save / eval frequency may change. Records this
    run's settings (`want`: run_settings, computed when not given) beside its checkpoints."""
    want = run_settings(lev) if want is None else want
    root = f"{lev['trainer']['checkpointer']['base_path']}/{lev['trainer']['id']}"
    fs, path = fsspec.core.url_to_fs(root)
    record = f"{path}/llmpipe-settings.json"
    if fs.exists(record) and fs.glob(f"{path}/step-*/metadata.json"):
        have = json.loads(fs.cat_file(record))
        have = {k: v for k, v in have.items() if k not in NEUTRAL}  # recorded by an older llmpipe
        keys = (want.keys() | have.keys()) - {k for k in IDENTITY if k not in have}  # older records lack them
        diff = sorted(k for k in keys if want.get(k) != have.get(k))
        if diff:
            changes = ", ".join(f"{k}: {have.get(k)!r} -> {want.get(k)!r}" for k in diff)
            raise ValueError(
                f"checkpoints in {root} were trained with other settings ({changes}): "
                "set a new levanter.run_id, or delete that folder to start again (or train.resume: false)"
            )
    fs.makedirs(path, exist_ok=True)
    with fs.open(record, "w") as fh:
        fh.write(json.dumps(want, indent=1, sort_keys=True))


def _marker(lev: dict):
    fs, path = fsspec.core.url_to_fs(f"{lev['trainer']['checkpointer']['base_path']}/{lev['trainer']['id']}")
    return fs, path, f"{path}/{RESTART}"


def begin_restart(lev: dict, want: dict) -> bool:
    """train.resume false (trainer.load_checkpoint false): the run restarts once. True: it begins now, this
    run id's checkpoints and HF exports removed, then RESTART records the run's settings; False: a restart
    under these settings began already and this is its retry or rerun (a Slurm retry, --rerun-incomplete),
    which goes on from the restart's own checkpoints (llmpipe.train.resume.begin_restart for the others)."""
    fs, path, marker = _marker(lev)
    if fs.exists(marker) and json.loads(fs.cat_file(marker)).get("settings") == want:
        log.info("train.resume is false: the restart recorded in %s goes on from its own checkpoints", marker)
        return False
    run_id = lev["trainer"]["id"]
    for root in (f"{lev['trainer']['checkpointer']['base_path']}/{run_id}", f"{lev['hf_save_path']}/{run_id}"):
        rfs, rpath = fsspec.core.url_to_fs(root)
        if rfs.exists(rpath):
            log.warning("train.resume is false: removing %s (the earlier run's checkpoints / exports)", root)
            rfs.rm(rpath, recursive=True)
    fs.makedirs(path, exist_ok=True)
    with fs.open(marker, "w") as fh:
        fh.write(json.dumps({"settings": want}, indent=1, sort_keys=True))
    return True


def end_restart(lev: dict) -> None:
    """Resuming again (load_checkpoint not false): a later train.resume false is a new restart."""
    fs, _, marker = _marker(lev)
    if fs.exists(marker):
        fs.rm(marker)


def runnable(config_path: Path, lev: dict) -> Path:
    """The config Levanter runs: as written, but without trainer.load_checkpoint false (begin_restart did the
    fresh start; Levanter then finds no checkpoint, or on a retry the restart's own), beside it."""
    if lev["trainer"].get("load_checkpoint") is not False:
        return config_path
    run = copy.deepcopy(lev)
    del run["trainer"]["load_checkpoint"]
    out = config_path.with_name(f"{config_path.stem}.run.yaml")
    with atomic_path(out) as tmp:
        tmp.write_text(
            f"# {config_path.name} as levanter-train runs it (llmpipe restarts the run itself)\n"
            + yaml.safe_dump(run, sort_keys=False)
        )
    return out


def records_for(lev: dict, metrics: str | Path | None) -> LoggerRecords:
    # epoch = sequences trained / the train split's sequences (Levanter cuts the token stream into seq_len rows)
    info = cache_info(lev)
    train_tokens = info["splits"]["train"]["tokens"] if info else 0
    return LoggerRecords(
        Path(metrics) if metrics else None, lev["trainer"]["train_batch_size"], train_tokens // lev["train_seq_len"]
    )


def finished_checkpoint(lev: dict) -> str | None:
    """The last step's checkpoint folder when the run already finished (it and the last HF export exist)."""
    run_id, steps = lev["trainer"]["id"], lev["trainer"]["num_train_steps"]
    ckpt = f"{lev['trainer']['checkpointer']['base_path']}/{run_id}/step-{steps - 1}/metadata.json"
    found = latest_export(f"{lev['hf_save_path']}/{run_id}")
    fs, ckpt_path = fsspec.core.url_to_fs(ckpt)
    if found and found[1] + 1 == steps and fs.exists(ckpt_path):
        log.info("run %s already finished (%s and the last HF export exist): not training again", run_id, ckpt)
        return ckpt.rsplit("/", 1)[0]
    return None


def train_lm(config_path: str | Path, lev: dict, rec: LoggerRecords, jax_platforms: str) -> str | None:
    """Run levanter.main.train_lm, relaying its output and recording its metrics; the checkpoint it
    resumed from (None: from the start)."""
    env = {**os.environ, **OFFLINE, **({"JAX_PLATFORMS": jax_platforms} if jax_platforms else {})}
    cmd = [sys.executable, "-m", "levanter.main.train_lm", "--config_path", str(config_path)]
    log.info("running %s", " ".join(cmd))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    resumed_from = None
    for line in proc.stdout:
        sys.stderr.write(line)
        rec.add(line)
        if "Saving checkpoint" in line:
            rec.write()  # the checkpointed step's record survives an interruption
        m = RESUMED.search(line)
        if m:
            resumed_from = m.group(1)
            step = re.search(r"step-(\d+)/?$", resumed_from)
            if step:
                rec.resumed(int(step.group(1)) + 1)
    code = proc.wait()
    rec.write()
    if code != 0:
        raise RuntimeError(f"levanter.main.train_lm exited with {code} (its output is above)")
    return resumed_from


def publish(lev: dict, out: str | Path, rec: LoggerRecords, resumed_from: str | None) -> dict:
    """Copy the last step's HF export to `out` with train_summary.json; the summary."""
    run_id, steps = lev["trainer"]["id"], lev["trainer"]["num_train_steps"]
    found = latest_export(f"{lev['hf_save_path']}/{run_id}")
    if found is None or found[1] + 1 != steps:
        raise RuntimeError(
            f"no HF export of the last step ({steps - 1} in Levanter's numbering) under "
            f"{lev['hf_save_path']}/{run_id}; found {found}"
        )
    src, last = found
    done = [r for _, r in sorted(rec.records.items())]
    evals = [r for r in done if "val_loss" in r]
    summary = {
        "backend": "levanter",
        "run_id": run_id,
        "steps": last + 1,
        "levanter_export": src,
        "resumed_from": resumed_from,
        "final_loss": next((r["loss"] for r in reversed(done) if "loss" in r), None),
        "last_val_loss": evals[-1]["val_loss"] if evals else None,
        "last_val_step": evals[-1]["step"] if evals else None,
    }
    fs, path = fsspec.core.url_to_fs(src)
    with atomic_path(out) as tmp:
        tmp.mkdir()
        for f in fs.ls(path, detail=False):
            fs.get(f, str(tmp / Path(f).name))
        write_json(tmp / "train_summary.json", summary)
    log.info("levanter: %s", summary)
    return summary


def run(config_path: str | Path, out: str | Path, metrics: str | Path | None, jax_platforms: str = "") -> dict:
    require_levanter()
    config_path = Path(config_path)
    lev = yaml.safe_load(config_path.read_text())
    rec, want = records_for(lev, metrics), run_settings(lev)
    if lev["trainer"].get("load_checkpoint") is False:
        begin_restart(lev, want)
    else:
        end_restart(lev)
    check_resume(lev, want)  # before a finished run is published again: it must have been trained as configured
    resumed_from = finished_checkpoint(lev)
    if resumed_from is not None:
        rec.write()
    else:
        resumed_from = train_lm(runnable(config_path, lev), lev, rec, jax_platforms)
    return publish(lev, out, rec, resumed_from)


def main(argv: list[str] | None = None) -> None:
    from llmpipe import config as cfgmod
    from llmpipe.backends.levanter import config as levconfig

    p = argparse.ArgumentParser(
        prog="llmpipe levanter-train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--levanter-config", help="a config.yaml written by llmpipe levanter-config, run as it is")
    p.add_argument("--workdir", help="or: write config.yaml + reference/ here first from --config ... --output")
    levconfig.add_arguments(p, required=False)
    p.add_argument("--out", required=True, help="HF-format folder to write (checkpoints/levanter/final)")
    p.add_argument("--metrics", help="metrics.jsonl to write")
    p.add_argument("--jax-platforms", default="", help="JAX_PLATFORMS for Levanter (cpu, tpu); empty: JAX chooses")
    args = p.parse_args(argv)
    parts = (args.config, args.cache, args.tokenizer, args.init, args.output)
    if bool(args.levanter_config) == bool(args.workdir) or (args.workdir and not all(parts)):
        p.error("give --levanter-config, or --workdir with --config, --cache, --tokenizer, --init and --output")
    config = args.levanter_config or levconfig.write(cfgmod.load(args.config), *parts[1:], args.workdir)
    try:
        run(config, args.out, args.metrics, args.jax_platforms)
    except ValueError as exc:  # checkpoints of other settings: one line, the ways out in it
        raise SystemExit(f"llmpipe levanter-train: {exc}") from None
