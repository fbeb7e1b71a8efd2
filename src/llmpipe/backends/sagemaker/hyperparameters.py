"""Settings checks, mode A hyperparameters and job names.

Mode A (marketplace algorithm): the algorithm takes 13 string hyperparameters; they are mapped from
the shared `train:` schema so every backend reads the same keys. Extra ones come from
sagemaker.hyperparameters and may not shadow the mapped 13.
"""

from __future__ import annotations

import hashlib
import json
import re

# Marketplace name -> (section, key) of our config.
ALGORITHM_HYPERPARAMETERS = {
    "GLOBAL_BATCH_SIZE": ("train", "global_batch_size"),
    "MICRO_BATCH_SIZE": ("train", "micro_batch_size"),
    "LEARNING_RATE": ("train", "lr"),
    "MAX_STEP": ("train", "max_steps"),
    "WARMUP_STEPS": ("train", "warmup_steps"),
    "WEIGHT_DECAY": ("train", "weight_decay"),
    "BETA1": ("train", "beta1"),
    "BETA2": ("train", "beta2"),
    "GRAD_CLIP": ("train", "grad_clip"),
    "MIN_LR": ("train", "min_lr"),
    "MODEL_NAME": ("sagemaker", "model_name"),
    "SAVE_STEP_INTERVAL": ("train", "save_interval"),
    "EVAL_STEP_INTERVAL": ("train", "eval_interval"),
}


class SettingsError(ValueError):
    """The sagemaker section (or what it needs elsewhere) is incomplete or inconsistent."""


def check_settings(config: dict) -> None:
    """What must hold before anything is uploaded or created (also checked when the DAG is built)."""
    sm = config["sagemaker"]
    missing = [k for k in ("role_arn", "s3_prefix") if not sm.get(k)]
    if sm["mode"] == "algorithm":
        missing += [] if sm.get("algorithm_name") else ["algorithm_name"]
        if "litgpt" not in config["data"]["views"]:
            raise SettingsError("sagemaker.mode algorithm trains on the lit-gpt view: add litgpt to data.views")
        if sm.get("image_uri"):
            raise SettingsError(
                "sagemaker.image_uri is for mode image; mode algorithm uses sagemaker.algorithm_name (set image_uri: null)"
            )
    else:
        missing += [] if sm.get("image_uri") else ["image_uri"]
        if sm.get("algorithm_name"):
            raise SettingsError(
                "sagemaker.algorithm_name is for mode algorithm; mode image uses sagemaker.image_uri (set algorithm_name: "
                "null: the sagemaker profile sets one)"
            )
    if missing:
        raise SettingsError(f"sagemaker.mode {sm['mode']} needs: " + ", ".join(f"sagemaker.{k}" for k in missing))
    if sm["mode"] == "image":
        ours = sorted(set(sm["hyperparameters"]) & set(IMAGE_HYPERPARAMETERS))
        if ours:
            where = ", ".join(f"{k} ({IMAGE_HYPERPARAMETERS[k]})" for k in ours)
            raise SettingsError(f"sagemaker.hyperparameters may not set what llmpipe passes the container: {where}")
    shadowed = sorted(set(sm["hyperparameters"]) & set(ALGORITHM_HYPERPARAMETERS))
    if shadowed:
        where = ", ".join(f"{k} (set {'.'.join(ALGORITHM_HYPERPARAMETERS[k])})" for k in shadowed)
        raise SettingsError(f"sagemaker.hyperparameters may not set the mapped hyperparameters: {where}")


# What image mode passes its container (jobs.build_request), from the config.
IMAGE_HYPERPARAMETERS = {"llmpipe_config": "the train and eval sections", "processes_per_instance": "parallel.nproc_per_node"}


def settings_problems(config: dict) -> list[str]:
    """check_settings's verdict as a list of problems (llmpipe.config.validate runs it)."""
    try:
        check_settings(config)
    except SettingsError as exc:
        return [str(exc)]
    return []


def _text(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return repr(value)  # shortest round-trip form: 0.0016 -> "0.0016", 1e-08 -> "1e-08"
    return str(value)


def algorithm_hyperparameters(config: dict) -> dict[str, str]:
    """The 13 marketplace hyperparameters (strings) from train.* and sagemaker.model_name, plus extras."""
    hp = {name: _text(config[section][key]) for name, (section, key) in ALGORITHM_HYPERPARAMETERS.items()}
    hp.update({k: str(v) for k, v in config["sagemaker"]["hyperparameters"].items()})
    return hp


def job_name(prefix: str, run: str, key: str, attempt: int) -> str:
    """<prefix>-<run>-<key>[-r<attempt>] cut to AWS's 63 characters, only [A-Za-z0-9-].

    key: a hash of everything the job depends on, so the same inputs give the same name (a rerun
    attaches) and changed inputs a new job."""
    stem = re.sub(r"[^A-Za-z0-9-]+", "-", f"{prefix}-{run}").strip("-")
    stem = re.sub(r"-{2,}", "-", stem)[: 63 - len(f"-{key}-r20")].rstrip("-")  # room for any attempt suffix
    return f"{stem}-{key}" + (f"-r{attempt}" if attempt > 1 else "")


def request_key(parts: dict) -> str:
    """Short stable hash of the job's inputs and settings."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:10]
