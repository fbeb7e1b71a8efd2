"""A run's identity: the model, tokenizer and backend its results/<run>/ folder was built for.

The run name follows the preset or profile unless you name it (llmpipe.profiles.default_run), so runs of
different hardware paths get their own folders. A name given twice is caught here: the first run that
starts a job records its identity in results/<run>/run-identity.json (written atomically, never
replaced), and a later config under the same name with another model shape or base (`model.init_from`),
tokenizer or `train.backend` stops when the workflow is parsed, before any job, naming the run, what
differs and the ways out. A dry run only checks.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

FILE = "run-identity.json"
# model.* keys that make the architecture (a base model, model.init_from, brings its own)
MODEL_SHAPE = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "tie_word_embeddings",
    "rope_theta",
    "rms_norm_eps",
    "vocab_multiple",
)
TRAINED_TOKENIZER = ("vocab_size", "min_frequency", "max_train_documents")  # tokenizer.source: train


class IdentityClash(RuntimeError):
    """The run's folder was built for another model, tokenizer or backend."""


def identity(cfg: dict) -> dict:
    """What a run's folder is for, from a validated config: config keys, nested as in the config."""
    m, t = cfg["model"], cfg["tokenizer"]
    model = {"init_from": m["init_from"]} if m["init_from"] else {k: m[k] for k in MODEL_SHAPE}
    tokenizer = {"source": t["source"]}
    if t["source"] == "train":
        tokenizer.update({k: t[k] for k in TRAINED_TOKENIZER})
    return {"model": model, "tokenizer": tokenizer, "train": {"backend": cfg["train"]["backend"]}}


def _flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in data.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise IdentityClash(f"{path}: unreadable run identity ({exc}); delete it to record this run's again") from None
    if not isinstance(data, dict) or not isinstance(data.get("identity"), dict):
        raise IdentityClash(f"{path}: not a run identity (no 'identity' mapping); delete it to record this run's again")
    return data


def clash(cfg: dict, run_dir: Path) -> str | None:
    """One message when results/<run>/ holds another identity than `cfg`'s; None when it agrees or has none."""
    path = Path(run_dir) / FILE
    try:
        recorded = _read(path)
    except IdentityClash as exc:
        return str(exc)
    if recorded is None:
        return None
    return _message(cfg, run_dir, recorded["identity"], identity(cfg), recorded.get("preset"))


def _message(cfg: dict, run_dir: Path, old: dict, new: dict, preset: str | None) -> str | None:
    if old == new:
        return None
    a, b = _flat(old), _flat(new)
    diff = "; ".join(f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
    built = f" (preset {preset})" if preset else ""
    run = cfg["run"]
    return (
        f"run {run!r} ({run_dir}) was built for another model, tokenizer or backend{built}: {diff} "
        f"(recorded in {Path(run_dir) / FILE}); nothing was deleted and no job ran. Give this config its own run: "
        f"--config run=NEW_NAME (or `run: NEW_NAME` in your --configfile), or, to rebuild {run_dir} for this "
        f"config, delete {Path(run_dir) / FILE} (its outputs are then replaced as the rules rerun)"
    )


def record(cfg: dict, run_dir: Path) -> bool:
    """Write results/<run>/run-identity.json unless it is there (temp file + link: never a partial file,
    never replaced). True when written. Raises IdentityClash when one with another identity is there
    (another run took the name since the check)."""
    run_dir = Path(run_dir)
    path = run_dir / FILE
    data = {"run": cfg["run"], "preset": cfg.get("preset"), "identity": identity(cfg)}
    if not path.exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / f".{FILE}.tmp-{os.getpid()}"
        try:
            with open(tmp, "w") as fh:
                fh.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, path)  # atomic, and fails if another process recorded first
            except FileExistsError:
                raise
            except OSError:  # a file system without hard links: rename (atomic; a race could replace)
                os.replace(tmp, path)
            return True
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    message = clash(cfg, run_dir)
    if message:
        raise IdentityClash(message)
    return False
