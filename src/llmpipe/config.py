"""Load and validate pipeline configs against the one JSON schema (defaults filled in)."""

from __future__ import annotations

import copy
import difflib
import functools
import hashlib
import json
import logging
import math
import os
import re
from pathlib import Path

import yaml

from llmpipe.io import SECRET_QUERY  # query parameters that carry a credential

SCHEMA_PATH = Path(__file__).with_name("config_schema.yaml")


class ConfigError(ValueError):
    """A config key is unknown, mistyped or out of range."""


def _read_yaml(path: Path):
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@functools.lru_cache(maxsize=1)
def _schema() -> dict:
    """The one schema: config_schema.yaml plus each backend's section (its schema.yaml), train.backend
    limited to the backends there are. Built once per process (validation runs for every job)."""
    from llmpipe import backends

    schema = _read_yaml(SCHEMA_PATH)
    schema["properties"]["train"]["properties"]["backend"]["enum"] = backends.available()
    for b in backends.all_backends():
        if b.section_schema:
            schema["properties"][b.name] = _read_yaml(Path(b.section_schema))
    return schema


def load_schema() -> dict:
    return copy.deepcopy(_schema())


def _with_defaults(validator_class):
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub:
                    instance.setdefault(name, copy.deepcopy(sub["default"]))
        yield from validate_properties(validator, properties, instance, schema)

    import jsonschema

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


def _is_integer(checker, value) -> bool:
    """Strict: 256.0 is not an integer (JSON Schema would accept it), nor is True."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(checker, value) -> bool:
    """Finite numbers only: NaN passes every range check, inf breaks schedules."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@functools.cache
def _validator():
    """The schema's validator (jsonschema imported here: ~0.06 s a process, which a cached check skips)."""
    import jsonschema

    cls = jsonschema.validators.extend(
        _with_defaults(jsonschema.Draft202012Validator),
        type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine_many({"integer": _is_integer, "number": _is_number}),
    )
    return cls(_schema())


# ---------------------------------------------------------------- a cache of schema checks
# Every job validates its slice of the config: ~0.14 s of a job's start-up, ~0.07 s on a cache hit (no
# jsonschema import, no schema walk). A config that passed is kept, defaults filled, under the sha256 of
# its text and of the schema files, so the same config under the same schema is checked once per machine
# (per cache dir).
CACHE_ENV = "LLMPIPE_CONFIG_CACHE"  # a folder; "off" (or "0") disables the cache


def _cache_dir() -> Path | None:
    value = os.environ.get(CACHE_ENV)
    if value in ("off", "0"):
        return None
    if value:
        return Path(value)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llmpipe" / "config"


@functools.cache
def _schema_stamp() -> str:
    """sha256 of what the checks are built from: config_schema.yaml, each backend's name and section file, and
    llmpipe's own code (~10 ms: a cached result never outlives the checks that made it, e.g. after an upgrade)."""
    from llmpipe import backends

    h = hashlib.sha256(SCHEMA_PATH.read_bytes())
    for b in backends.all_backends():
        h.update(f"\0{b.name}\0".encode())
        if b.section_schema:
            h.update(Path(b.section_schema).read_bytes())
    for f in sorted(Path(__file__).parent.rglob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()


def _plain(value) -> bool:
    """JSON gives it back unchanged: str keys; str, int, finite float, bool, None, list, dict values."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(map(_plain, value))
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, (str, int, bool))


def _cache_file(config: dict) -> Path | None:
    folder = _cache_dir()
    if folder is None:
        return None
    if not _plain(config):  # a YAML date, a number as a key, NaN: checked every time
        return None
    text = json.dumps(config, sort_keys=True)
    return folder / f"{hashlib.sha256(f'{_schema_stamp()}:{text}'.encode()).hexdigest()}.json"


def _cached(file: Path | None) -> dict | None:
    if file is None:
        return None
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError):
        return None


def _remember(file: Path | None, checked: dict) -> None:
    if file is None:
        return
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(checked, fh)
        os.replace(tmp, file)
    except (OSError, TypeError, ValueError) as exc:  # a read-only or full home: no cache, same result
        logging.getLogger(__name__).debug("config check not cached (%s)", exc)


# Names other tools use (NxD, SageMaker marketplace, HF Trainer) for keys of ours.
ALIASES = {
    "learning_rate": "lr",
    "max_step": "max_steps",
    "train_batch_size": "global_batch_size",
    "per_device_train_batch_size": "micro_batch_size",
    "batch_size": "global_batch_size",
    "save_step_interval": "save_interval",
    "eval_step_interval": "eval_interval",
    "checkpoint_freq": "save_interval",
    "max_grad_norm": "grad_clip",
    "adam_beta1": "beta1",
    "adam_beta2": "beta2",
    "block_size": "seq_len",
    "max_length": "seq_len",
    "seq_length": "seq_len",
    # resources: sbatch / Slurm names
    "mem": "mem_mb",
    "memory": "mem_mb",
    "cpus": "cpus_per_task",
    "cpus_per_node": "cpus_per_task",
    "time": "runtime",
    "walltime": "runtime",
    "gpus": "gpu",
    "partition": "slurm_partition",
    "account": "slurm_account",
    "nodes": "nnodes",
    "num_nodes": "nnodes",
}


def _subschema(schema: dict, path: list) -> dict:
    root = schema
    for part in path:
        if isinstance(part, int):
            schema = schema.get("items", {})
        else:
            extra = schema.get("additionalProperties")
            schema = schema.get("properties", {}).get(part, extra if isinstance(extra, dict) else {})
        if "$ref" in schema:  # only local refs: "#/$defs/<name>"
            schema = root["$defs"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def _describe(error, schema: dict) -> str:
    path = [str(p) for p in error.absolute_path]
    where = ".".join(path) or "<top level>"
    if error.validator == "additionalProperties":
        known = sorted(_subschema(schema, list(error.absolute_path)).get("properties", {}))
        unknown = sorted(set(error.instance) - set(known))
        parts = []
        for key in unknown:
            full = ".".join(path + [key])
            alias = ALIASES.get(key.lower())
            hint = [alias] if alias in known else difflib.get_close_matches(key, known, n=1)
            if path[:1] == ["resources"] and key in ("nodes", "tasks"):
                hint = ["parallel.nnodes"]  # nodes follow the launch, so they are set in one place
            head, dot, rest = key.partition(".")
            if dot and head in known:  # `train.lr: ...` in a YAML file: keys nest, a dot is part of the name
                parts.append(f"unknown key '{full}' (write it nested: {head}: {{{rest}: ...}})")
                continue
            parts.append(f"unknown key '{full}'" + (f" (did you mean '{hint[0]}'?)" if hint else ""))
        return "; ".join(parts) + f"; allowed here: {', '.join(known)}"
    hint = ""
    if error.validator == "enum" and isinstance(error.instance, str):
        close = difflib.get_close_matches(error.instance, [str(v) for v in error.validator_value], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"'{where}': {error.message}{hint}"


def validate(config: dict | None, whole: bool = True) -> dict:
    """Validate a config (mutated in place: defaults filled) and return it.

    whole: also run the selected backend's checks and the resource rule names (check-config and the
    workflow, where the whole config and the workflow are at hand; a job's slice of the config, read by
    `load`, was checked there). Raises ConfigError naming every
    offending key.
    """
    config = {} if config is None else config
    from llmpipe import parallelism

    moved = parallelism.moved_keys(config)
    if moved:
        raise ConfigError("invalid llmpipe config:\n" + "\n".join(f"  - {m}" for m in moved))
    cache = _cache_file(config)
    checked = _cached(cache)
    if checked is not None:
        config.clear()
        config.update(checked)
    else:
        schema = _schema()  # read only
        _coerce_numbers(config, schema, schema)
        errors = sorted(_validator().iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
        if errors:
            lines = "\n".join(f"  - {_describe(e, schema)}" for e in errors)
            raise ConfigError(f"invalid llmpipe config:\n{lines}")
        _remember(cache, config)
    parallelism.resolve(config)
    problems = (
        _credential_checks(config)
        + _cross_checks(config)
        + _hub_checks(config, whole)
        + (_resource_checks(config) if whole else [])
    )
    if whole and not problems:  # a backend's checks may assume the shared keys are consistent
        problems = backend_checks(config)
    if problems:
        raise ConfigError("invalid llmpipe config:\n" + "\n".join(f"  - {p}" for p in problems))
    return config


def _credential_checks(config: dict) -> list[str]:
    """A URL holding a credential (user:password@, a presigned signature, a token) anywhere in the config:
    refused, as it would reach rule params, logs, stats.json and a released model card. The value is not
    repeated in the message."""
    out = []

    def walk(value, where: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{where}.{k}" if where else str(k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{where}[{i}]")
        elif isinstance(value, str) and "://" in value:
            authority = value.split("://", 1)[1].split("/", 1)[0]
            kind = "a user name or password (user:password@host)" if "@" in authority else None
            kind = kind or ("a signature or token in its query" if SECRET_QUERY.search(value) else None)
            if kind:
                out.append(
                    f"'{where}' is a URL holding {kind}: it would be written to logs, Snakemake's records, stats.json "
                    "and a released model card. Give credentials through the environment instead (the AWS credential "
                    "chain for s3:// and SageMaker, HF_TOKEN for the Hub), or copy a private https:// file to a bucket"
                )

    walk(config, "")
    return out


def _cross_checks(config: dict) -> list[str]:
    """Constraints between keys that the schema cannot express, each message naming its keys."""
    train, model, out = config["train"], config["model"], []
    if train["min_lr"] > train["lr"]:
        out.append(f"'train.min_lr' ({train['min_lr']}) exceeds 'train.lr' ({train['lr']})")
    heads, kv = model["num_attention_heads"], model["num_key_value_heads"]
    if not model["init_from"]:  # a base model brings its own shape
        if model["hidden_size"] % heads:
            out.append(f"'model.hidden_size' ({model['hidden_size']}) is not a multiple of 'model.num_attention_heads' ({heads})")
        elif (model["hidden_size"] // heads) % 2:
            out.append(
                f"'model.hidden_size' / 'model.num_attention_heads' = {model['hidden_size'] // heads}"
                " must be even (rotary embeddings rotate pairs)"
            )
        if heads % kv:
            out.append(f"'model.num_attention_heads' ({heads}) is not a multiple of 'model.num_key_value_heads' ({kv})")
    tp = config["parallel"]["tp"]
    if train["seq_len"] % tp:
        out.append(
            f"'train.seq_len' ({train['seq_len']}) is not a multiple of 'parallel.tp' ({tp}): sequence parallelism"
            " splits each sequence over the tensor-parallel ranks"
        )
    if train["slurm_auto_resume"]:
        if train["backend"] not in ("torch", "colossal", "neuron"):
            out.append(
                f"'train.slurm_auto_resume' applies to jobs launched with srun (backends torch, neuron, colossal with"
                f" colossal.launcher llmpipe); train.backend is {train['backend']!r}"
            )
        elif train["launcher"] == "local":
            out.append("'train.slurm_auto_resume' needs srun, but 'train.launcher' is local")
    nodes = config["parallel"]["nnodes"]
    if train["launcher"] == "local" and nodes > 1 and train["backend"] in ("torch", "colossal", "neuron"):
        out.append(
            f"'train.launcher' local starts one node's processes, but 'parallel.nnodes' is {nodes} (the other nodes"
            " would sit idle and the batch shrink): use launcher auto or srun"
        )
    base = base_config_json(config) if model["init_from"] else None
    positions = json.loads(base.read_text()).get("max_position_embeddings") if base else None
    if positions and train["seq_len"] > positions:
        out.append(seq_len_past_base(train["seq_len"], positions))
    plan = config["plan"]
    if plan["tokens"] is not None and plan["epochs"] is not None:
        out.append("'plan.tokens' and 'plan.epochs' are both set: set one (each gives the steps)")
    if plan["hardware"] or plan["hardware_file"]:
        from llmpipe.plan.hardware import load_hardware

        try:
            load_hardware(plan)
        except (ValueError, OSError) as exc:
            out.append(str(exc))
    if model["init_from"] is None and config["tokenizer"]["source"] == "base":
        out.append("'tokenizer.source' is 'base' (the base model's tokenizer) but 'model.init_from' is not set")
    return out


def _resource_checks(config: dict) -> list[str]:
    from llmpipe import backends

    names = backends.workflow_rules()
    unknown = sorted(set(config["resources"]) - names - {"default", "train"})
    if unknown:
        return [
            f"unknown rule(s) under 'resources': {', '.join(unknown)}; use default, train or one of: {', '.join(sorted(names))}"
        ]
    return []


def _hub_checks(config: dict, whole: bool = True) -> list[str]:
    """`whole` (the workflow, check-config; not a job, which may run where the user's folders are not): a
    local folder named that does not exist."""
    from llmpipe.hub import HUB_PREFIX, is_hub_ref

    out = []
    release = config["hub"]["release"]
    if release["enabled"] and not release["repo_id"]:
        out.append("'hub.release.enabled' is true but 'hub.release.repo_id' is not set")
    if release["enabled"] and config["model"]["init_from"] and not release["license"]:
        out.append(
            f"'hub.release.license' is not set but the model continues {config['model']['init_from']!r} "
            "(model.init_from): its licence carries over to the release; set it (e.g. llama2, llama3, apache-2.0)"
        )
    for key, ref in (("model.init_from", config["model"]["init_from"]), ("tokenizer.source", config["tokenizer"]["source"])):
        # org/name with no such path is a Hub repo; but a missing path under a folder that exists here is a typo
        if ref and not ref.startswith(HUB_PREFIX) and is_hub_ref(ref) and Path(ref.split("/", 1)[0]).is_dir():
            out.append(
                f"'{key}' {ref!r}: no such local path, though {ref.split('/', 1)[0]}/ exists here; "
                f"for the Hub repo of that name write '{HUB_PREFIX}{ref}'"
            )
        elif whole and ref and ref not in ("train", "base") and not is_hub_ref(ref) and not _made_or_here(ref, config):
            out.append(f"'{key}' {ref!r}: no such local folder, and not a Hub id (org/name[@revision])")
    return out


def _made_or_here(path: str, config: dict) -> bool:
    """A local path that exists, or one under results_dir (this run's own outputs: a downloaded base)."""
    made = Path(config["results_dir"]).resolve()
    return Path(path).exists() or Path(path).resolve().is_relative_to(made)


def backend_checks(config: dict) -> list[str]:
    """The selected backend's own checks (llmpipe.backends: Backend.checks)."""
    from llmpipe import backends

    backend = backends.get(config["train"]["backend"])
    return backend.checks(config) if backend.checks else []


EXP_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")


def _coerce_numbers(config, schema: dict, root: dict) -> None:
    """PyYAML (and so Snakemake's --configfile) reads `lr: 3e-4` as a string: where only a number
    fits, take the number meant."""
    if not isinstance(config, dict):
        return
    extra = schema.get("additionalProperties")
    for key, value in config.items():
        sub = schema.get("properties", {}).get(key, extra if isinstance(extra, dict) else None)
        if not isinstance(sub, dict):
            continue
        if "$ref" in sub:
            sub = root["$defs"][sub["$ref"].rsplit("/", 1)[-1]]
        types = sub.get("type", [])
        types = [types] if isinstance(types, str) else types
        if isinstance(value, dict):
            _coerce_numbers(value, sub, root)
        elif isinstance(value, list) and isinstance(sub.get("items"), dict):  # e.g. data.sources' mixture items
            item = sub["items"]
            for alt in item.get("anyOf") or item.get("oneOf") or [item]:
                if "properties" in alt:
                    for v in value:
                        _coerce_numbers(v, alt, root)
        elif isinstance(value, str) and "number" in types and "string" not in types and EXP_FLOAT.match(value):
            config[key] = float(value)


class _Loader(yaml.SafeLoader):
    """YAML with YAML 1.2 / JSON floats: `lr: 3e-4` is a number, not the string PyYAML makes of it."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", EXP_FLOAT, list("-+0123456789."))


def load(source: str | Path | dict | None, whole: bool = False) -> dict:
    """Config from a YAML/JSON file path, inline JSON text or a dict; validated, defaults filled.
    Jobs read the slice of the config they depend on: whole=False skips the backend's checks (see validate)."""
    if source is None or isinstance(source, dict):
        return validate(copy.deepcopy(source), whole)
    text = str(source)
    if text.lstrip().startswith("{"):
        data = json.loads(text)
    else:
        path = Path(text)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        data = yaml.load(path.read_text(), Loader=_Loader)
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"config must be a mapping, got {type(data).__name__}")
    return validate(data, whole)


def run_dir(config: dict) -> Path:
    return Path(config["results_dir"]) / config["run"]


def seq_len_past_base(seq_len: int, positions: int) -> str:
    return (
        f"'train.seq_len' ({seq_len}) exceeds the max_position_embeddings ({positions}) of 'model.init_from' (its "
        "config.json): the export would still claim that many positions. Lower train.seq_len, or raise "
        "max_position_embeddings (with the rope_scaling the model needs) in the base's config.json"
    )


def base_config_json(config: dict) -> Path | None:
    """config.json of model.init_from: the local folder's, or for a Hub id this run's download (None: not yet)."""
    from llmpipe.hub import is_hub_ref

    base = config["model"]["init_from"]
    if not base:
        return None
    folder = run_dir(config) / "checkpoints" / "base" if is_hub_ref(base) else Path(base)
    return folder / "config.json" if (folder / "config.json").is_file() else None
