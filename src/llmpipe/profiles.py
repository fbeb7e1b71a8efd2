"""Which Snakemake profile is active, and the config it stands for (one place for the Snakefile and the CLI).

A profile folder holds Snakemake's `config.v8+.yaml` (executor, resources) and, for a hardware profile,
`llmpipe.yaml`: the pipeline settings that make it that hardware's path (a `preset`, the backend,
hardware keys). The config is built in layers, later wins:

  config/config.yaml  <  config/presets/<preset>.yaml  <  profile's llmpipe.yaml  <  user --configfile / --config

The profile's layer is loaded by the Snakefile itself, not through the profile's `configfiles:` (which a
command-line --configfile replaces), so a user's own config never drops it. A user layer that names
another backend than the profile's stops the run, naming both. The run name (results/<run>/) follows
the preset, else the profile, unless a layer names `run` (default_run).

The profile is found with Snakemake's own argument parser and profile lookup (`--profile NAME|PATH`,
$SNAKEMAKE_PROFILE), in the main process; the main process exports it as $LLMPIPE_PROFILE, which
cluster jobs inherit (the Slurm executor submits with --export=ALL) and read instead.
"""

from __future__ import annotations

import ast
import builtins
import copy
import os
import re
from pathlib import Path

import yaml

from llmpipe.config import ConfigError

PROFILE_ENV = "LLMPIPE_PROFILE"
OVERLAY = "llmpipe.yaml"
REPO = Path(__file__).resolve().parents[2]
# sbatch options the Slurm plugin sets itself (it refuses them in slurm_extra only when it submits the job,
# hours into a run) -> the plugin's resource that asks for it
MANAGED_BY = {
    "quality of service": "qos",
    "partition": "slurm_partition",
    "account": "slurm_account",
    "memory": "mem_mb",
    "memory per CPU": "mem_mb_per_cpu",
    "runtime/time limit": "runtime",
    "node constraints": "constraint",
    "generic resources (GRES)": "gres",
    "GPU allocation": "gpu",
    "CPUs per task": "cpus_per_task",
    "CPUs per GPU": "cpus_per_gpu",
    "tasks per GPU": "tasks_per_gpu",
    "number of nodes": "nodes",
    "number of tasks": "tasks",
    "cluster specification": "clusters",
}


def merge(base: dict, over: dict) -> dict:
    """Nested update like Snakemake's update_config: mappings merge, anything else replaces."""
    out = copy.deepcopy(base)
    for key, value in (over or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _read_yaml(path: Path, what: str) -> dict:
    from llmpipe.config import _Loader

    if not path.is_file():
        raise ConfigError(f"{what} not found: {path}")
    data = yaml.load(path.read_text(), Loader=_Loader) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path} must be a mapping, got {type(data).__name__}")
    return data


def snakemake_profiles(argv: list[str]) -> list[Path]:
    """Profile folders the `snakemake` command line (or $SNAKEMAKE_PROFILE) names, resolved the way
    Snakemake resolves them (current folder, then ~/.config/snakemake, /etc/xdg/snakemake)."""
    from snakemake.cli import get_argument_parser, get_profile_dir

    args, _ = get_argument_parser().parse_known_args(argv)
    found = []
    for name in args.profile or []:
        if name == "none":
            continue
        entry = get_profile_dir(name)
        if entry is not None:
            found.append(Path(entry[0]).resolve())
    return found


def active_profile(argv: list[str] | None = None, environ: dict | None = None) -> Path | None:
    """The profile folder with an llmpipe.yaml in force: the last such one the snakemake command line `argv`
    (None: not a command line, an API caller) names or $SNAKEMAKE_PROFILE does, else $LLMPIPE_PROFILE (set for
    cluster jobs by the main process), else None."""
    environ = os.environ if environ is None else environ
    with_overlay = [p for p in snakemake_profiles(list(argv)) if (p / OVERLAY).is_file()] if argv is not None else []
    if with_overlay:
        return with_overlay[-1]
    named = environ.get(PROFILE_ENV)
    if named:
        path = Path(named)
        if not (path / OVERLAY).is_file():
            raise ConfigError(f"${PROFILE_ENV} is {named!r}, which has no {OVERLAY}")
        return path.resolve()
    return None


def profile_dir(name: str) -> Path:
    """A profile folder found as Snakemake finds it (this folder, then the user's and the system's profile
    folders); ConfigError naming this checkout's profiles if there is none."""
    found = snakemake_profiles(["--profile", name])
    if not found:
        known = ", ".join(sorted(p.name for p in (REPO / "profiles").iterdir() if p.is_dir()))
        raise ConfigError(f"profile {name!r} not found; this checkout's profiles: {known}")
    return found[0]


def profile_settings(profile: Path | None) -> dict:
    """Snakemake's settings of a profile folder (executor, resources: its config.v8+.yaml), {} without one."""
    spec = profile / "config.v8+.yaml" if profile is not None else None
    return yaml.safe_load(spec.read_text()) or {} if spec is not None and spec.is_file() else {}


def named_executor(argv: list[str]) -> str | None:
    """The executor a `snakemake` command line names: --executor / -e, else its last profile's `executor`."""
    from snakemake.cli import get_argument_parser

    named = get_argument_parser().parse_known_args(argv)[0].executor
    given = snakemake_profiles(argv)
    return named or (profile_settings(given[-1]).get("executor") if given else None)


def snakemake_argv() -> list[str] | None:
    """sys.argv when this process is the snakemake command ([] for a bare `snakemake`); None for a Python
    API caller."""
    import sys

    prog = Path(sys.argv[0]).as_posix() if sys.argv else ""
    return sys.argv[1:] if prog.endswith(("snakemake", "snakemake/__main__.py")) else None


def preset_path(name: str, basedir: Path = REPO) -> Path:
    """config/presets/<name>.yaml, or a YAML path."""
    if name.endswith((".yaml", ".yml")) or "/" in name:
        return Path(name)
    return basedir / "config" / "presets" / f"{name}.yaml"


def _presets(basedir: Path) -> str:
    return ", ".join(sorted(p.stem for p in (basedir / "config" / "presets").glob("*.yaml")))


def load_preset(name: str | None, basedir: Path = REPO) -> dict:
    if not name:
        return {}
    path = preset_path(name, basedir)
    if not path.is_file():
        raise ConfigError(f"unknown preset {name!r} ({path} not found); presets: {_presets(basedir)}")
    data = _read_yaml(path, "preset")
    if "preset" in data:
        raise ConfigError(f"preset {path} sets 'preset' itself; presets do not nest")
    return data


def _backend(*layers: dict, key: tuple[str, str] = ("train", "backend")) -> str | None:
    found = None
    for layer in layers:
        found = (layer.get(key[0]) or {}).get(key[1], found)
    return found


HARDWARE = ("neuron", "hw_backend")  # a profile's nodes: a preset or config for the other chip is refused


def _refuse_other_hardware(profile: Path, overlay: dict, user: dict, user_preset: dict) -> None:
    ours = _backend(overlay, key=HARDWARE)  # the profile's own nodes, as its llmpipe.yaml says
    theirs = _backend(user_preset, user, key=HARDWARE)
    if ours is not None and theirs is not None and theirs != ours:
        via = f" (through preset {user['preset']!r})" if (user.get("neuron") or {}).get("hw_backend") is None else ""
        raise ConfigError(
            f"profile {profile.name!r} runs on {ours} nodes (neuron.hw_backend {ours!r}, {profile / OVERLAY}), but your "
            f"--configfile / --config sets neuron.hw_backend {theirs!r}{via}: use the profile for {theirs} "
            f"(slurm-{theirs}), or a preset made for {ours}"
        )


def layered(user: dict, profile: Path | None = None, basedir: Path = REPO) -> tuple[dict, list[str]]:
    """The config before validation: defaults < preset < profile overlay < user; and where each layer came
    from. Refuses a user layer whose train.backend (directly or through its preset) is not the profile's."""
    defaults = _read_yaml(basedir / "config" / "config.yaml", "default config")
    overlay = _read_yaml(profile / OVERLAY, "profile settings") if profile else {}
    user = user or {}
    preset_name = user.get("preset") or overlay.get("preset") or defaults.get("preset")
    preset = load_preset(preset_name, basedir)
    origins = [str(basedir / "config" / "config.yaml")]
    if preset_name:
        origins.append(f"preset {preset_name} ({preset_path(preset_name, basedir)})")
    if profile:
        origins.append(f"profile {profile.name} ({profile / OVERLAY})")
        profile_backend = _backend(defaults, load_preset(overlay.get("preset"), basedir), overlay)
        user_preset = load_preset(user.get("preset"), basedir)
        user_backend = _backend(user_preset, user)
        if user_backend is not None and user_backend != profile_backend:
            direct = (user.get("train") or {}).get("backend") is not None
            via, key = ("", "train.backend") if direct else (f" (through preset {user['preset']!r})", "preset")
            raise ConfigError(
                f"profile {profile.name!r} trains with train.backend {profile_backend!r} ({profile / OVERLAY}), "
                f"but your --configfile / --config sets train.backend {user_backend!r}{via}. Drop {key} to "
                f"train on this profile's hardware, or choose the profile for {user_backend!r} "
                "(README: Run on your hardware)"
            )
        _refuse_other_hardware(profile, overlay, user, user_preset)
    if user:
        origins.append("your --configfile / --config")
    cfg = merge(merge(merge(defaults, preset), overlay), user)
    cfg["preset"] = preset_name
    if not any("run" in layer for layer in (preset, overlay, user)):
        cfg["run"] = default_run(preset_name, profile, defaults)
    return cfg, origins


def default_run(preset_name: str | None, profile: Path | None, defaults: dict) -> str:
    """The run name when no layer above the defaults names one: the preset's name, else the profile's
    (one with an llmpipe.yaml), else config/config.yaml's `run` (the embedded default: `default`). So runs
    of different presets or profiles never share results/<run>/ unless you name them alike."""
    if preset_name:
        path = preset_path(preset_name)
        return path.stem if path.name != f"{preset_name}.yaml" else preset_name  # a YAML path: its file name
    if profile is not None:
        return profile.name
    return defaults.get("run") or "default"


def profile_backend(profile: Path | None, basedir: Path = REPO) -> str | None:
    if profile is None:
        return None
    overlay = _read_yaml(profile / OVERLAY, "profile settings")
    return _backend(load_preset(overlay.get("preset"), basedir), overlay)


def slurm_extra_problems(extras: dict[str, str]) -> list[str]:
    """{rule: slurm_extra} -> a line for each sbatch option the Slurm executor plugin sets itself and so
    refuses in slurm_extra (its own list, when the plugin is installed), naming the resource to use."""
    try:
        from snakemake_executor_plugin_slurm.validation import get_forbidden_slurm_options
    except ImportError:
        return []
    import re

    from llmpipe.config import SCHEMA_PATH, _read_yaml

    in_config = set(_read_yaml(SCHEMA_PATH)["$defs"]["rule_resources"]["properties"])
    out = []
    for rule, extra in sorted(extras.items()):
        for pattern, what in get_forbidden_slurm_options().items():
            if re.search(pattern, extra):  # as the plugin matches it
                use = MANAGED_BY.get(what)
                if use in in_config:
                    fix = f"use resources {use!r} instead"
                elif use:
                    fix = f"use the Slurm resource {use!r} in the profile's set-resources instead"
                    fix += "; a training job's nodes and tasks: parallel.nnodes" if use in ("nodes", "tasks") else ""
                else:
                    fix = "remove it"
                out.append(f"resources of {rule}: slurm_extra {extra!r} sets the {what}, which the Slurm executor sets ({fix})")
    return out


def gres_gpus(gres) -> int:
    """GPUs in a gres string: gpu:8, gpu:a100:8, gpu:2(S:0-1); 0 for none."""
    return sum(int(n) for n in re.findall(r"gpu(?::[\w.-]+)?:(\d+)", str(gres or "")))


def resource_text(resource) -> str | None:
    """A Snakemake resource's string as the executor will get it: a profile's value is an expression,
    evaluated at submit time, and its own text where it is not Python (a SyntaxError, or a NameError:
    `-p gpu`, `--exclusive`); None for an expression of the job (wildcards, attempt, ...) or a non-string."""
    raw = getattr(resource, "raw", None)
    if isinstance(raw, str) and resource.is_evaluable():
        try:
            tree = ast.parse(raw, mode="eval")
        except SyntaxError:
            return raw
        try:
            raw = ast.literal_eval(tree)
        except ValueError:
            names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
            known = {"wildcards", "input", "attempt", "threads", "system_tmpdir", "shutil", "async_run"}
            return raw if names - known - set(dir(builtins)) else None
    return raw if isinstance(raw, str) and raw else None


def gpu_problem(backend: str, nproc: int, gres: str | None) -> str | None:
    """More processes a node than the GPUs its training job asks for (gres, per node): a backend whose
    trainer runs one process a GPU (Backend.process_per_gpu) would fail on a device inside the allocation."""
    from llmpipe import backends

    gpus = gres_gpus(gres)
    if not backends.get(backend).process_per_gpu or not gpus or nproc <= gpus:
        return None
    return (
        f"parallel.nproc_per_node {nproc} is more processes than train_{backend} asks GPUs for a node "
        f"(gres {gres!r}): one process a GPU; set parallel.nproc_per_node {gpus}, or resources: train: gres gpu:{nproc}"
    )


def runtime_minutes(resource) -> float | None:
    """A rule's `runtime` resource in minutes, as Snakemake reads it (a number: minutes; a string: a
    timespan such as 72h or 3d, plain digits being minutes); None when unset or an expression of the job."""
    raw = getattr(resource, "raw", resource)
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return float(raw)
    text = resource_text(resource) if hasattr(resource, "raw") else raw if isinstance(raw, str) else None
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    if not isinstance(text, str):
        return None
    from snakemake.resources import InvalidTimespan, parse_timespan

    text = text.strip()
    if text.replace(".", "", 1).isdigit():
        return float(text)
    try:
        return parse_timespan(text) / 60
    except (InvalidTimespan, ValueError):
        return None
