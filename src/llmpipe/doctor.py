"""llmpipe doctor: before anything is submitted, what a profile's jobs will need on this host and cluster.

  llmpipe doctor --profile gpu-colossal [--configfile my.yaml] [--config train='{lr: 1e-4}']

One line per problem, each naming its fix; exit 1 if any. Checked:
- environments: the main one (llmpipe's declared requirements, at their versions) and the training
  backend's own interpreter (`<backend>.python`: present, its packages at the backend's pins, its tools);
- the executor: Slurm's commands, the partitions and accounts named in `resources:`, GPUs in a partition
  when a rule asks for them;
- accelerators where the training rule runs on this host (local executor): CUDA, Neuron devices, TPU;
- credentials for the sources and sinks the config names (S3, the Hub, a SageMaker role), never printed;
- free disk for the run's outputs (the plan's token and parameter counts; a quick bound from the
  sources' sizes when `quick`, as before a non-dry run).

A non-dry `snakemake` runs the same checks (quick) before its first job (Snakefile `onstart`).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from llmpipe import backends, overrides, profiles
from llmpipe.config import ConfigError, validate

GIB = 2**30
REPO = profiles.REPO
SETUP_MAIN = "pip install -c requirements.lock -e ."
# profiles/sagemaker/llmpipe.yaml's placeholders: AWS's documentation account, an example bucket
EXAMPLE_MARKS = ("123456789012", "s3://example-llmpipe-bucket")
GATED_ORGS = {"meta-llama", "google", "mistralai"}  # their models need an accepted licence and a token


def _satisfied(req: Requirement, installed: dict[str, str | None]) -> str | None:
    """A problem line for one requirement, or None."""
    have = installed.get(req.name)
    if have is None:
        return f"{req.name} is not installed (needs {req})"
    if req.specifier and not req.specifier.contains(have, prereleases=True):
        return f"{req.name} {have} is installed, needs {req}"
    return None


def main_env() -> list[str]:
    """pyproject.toml's requirements (this checkout's; no extras) in this interpreter, which runs every
    job of the main environment (`python -m llmpipe`, PYTHONPATH = this checkout's src/)."""
    project = REPO / "pyproject.toml"
    if not project.is_file():  # a copy of the workflow without it: what the installed llmpipe declares
        try:
            declared = [r for r in (md.requires("llmpipe") or []) if "extra ==" not in r]
        except md.PackageNotFoundError:
            return [f"main environment ({sys.executable}): llmpipe is not installed (fix: {SETUP_MAIN})"]
    else:
        declared = tomllib.loads(project.read_text())["project"]["dependencies"]
    out = []
    for req in map(Requirement, declared):
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            have = None
        if problem := _satisfied(req, {req.name: have}):
            out.append(f"main environment ({sys.executable}): {problem} (fix: {SETUP_MAIN})")
    return out


def _interpreter(python: str) -> str | None:
    found = shutil.which(python) if "/" not in python else (python if os.access(python, os.X_OK) else None)
    return found


def backend_env(cfg: dict) -> list[str]:
    """The training backend's own interpreter: present, its pinned packages, its tools beside it."""
    b = backends.get(cfg["train"]["backend"])
    if not b.env_requires:
        return []
    key = f"{b.name}.python"
    python = cfg[b.name]["python"]
    setup = b.setup
    if setup and b.name == "levanter" and cfg["levanter"].get("jax_platforms") == "tpu":
        setup += " --tpu"  # JAX for TPUs (without it: CPU JAX)
    fix = f"fix: {setup} or set {key}" if setup else f"fix: set {key}"
    exe = _interpreter(python)
    if exe is None:
        return [f"{b.name} environment: {key} {python!r} not found ({fix})"]
    reqs = [Requirement(r) for r in b.env_requires]
    probe = (
        "import importlib.metadata as m, json, sys\n"
        "def v(n):\n    try: return m.version(n)\n    except m.PackageNotFoundError: return None\n"
        "print(json.dumps({n: v(n) for n in sys.argv[1:]}))"
    )
    try:
        done = subprocess.run([exe, "-c", probe, *[r.name for r in reqs]], capture_output=True, text=True, timeout=120)
        installed = json.loads(done.stdout)
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
        return [f"{b.name} environment: {key} {python!r} does not run ({fix})"]
    out = [f"{b.name} environment ({python}): {p} ({fix})" for r in reqs if (p := _satisfied(r, installed))]
    for tool in b.env_tools:
        if not (Path(exe).parent / tool).exists() and shutil.which(tool) is None:
            out.append(f"{b.name} environment ({python}): {tool} not found beside it or on PATH ({fix})")
    return out


def _named_resources(spec: dict, cfg: dict) -> list[tuple[str, dict]]:
    """(rule, its resources) as the workflow applies them (rules/common.smk apply_config_resources): the
    profile's default-resources < its set-resources < the config's resources default < rule < train
    (the training rule). "default" stands for every rule named nowhere."""
    backend = cfg["train"]["backend"]
    others = {r for b, rs in backends.rules_by_backend().items() if b != backend for r in rs}
    profile_set, config_res = spec.get("set-resources") or {}, cfg.get("resources") or {}
    threads = spec.get("set-threads") or {}
    names = {"default", f"train_{backend}", *profile_set, *threads, *config_res} - {"train"} - others
    out = []
    for rule in sorted(names):
        res = {**(spec.get("default-resources") or {}), **(profile_set.get(rule) or {})}
        res.update({**(config_res.get("default") or {}), **(config_res.get(rule) or {})})
        if rule == f"train_{backend}":
            res.update(config_res.get("train") or {})
        out.append((rule, res))
    return out


def _nodes() -> dict[str, dict]:
    """The largest node of each partition: {partition: {cpus, mem_mb, gpus}} from sinfo."""
    out: dict[str, dict] = {}
    for line in (_run(["sinfo", "-h", "-o", "%R|%c|%m|%G"]) or "").splitlines():
        part, cpus, mem, gres = line.split("|")
        node = {"cpus": int(cpus.rstrip("+")), "mem_mb": int(mem.rstrip("+")), "gpus": profiles.gres_gpus(gres)}
        have = out.setdefault(part, node)
        out[part] = {k: max(have[k], node[k]) for k in node}
    return out


def _run(cmd: list[str]) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def executor(spec: dict, cfg: dict) -> list[str]:
    if spec.get("executor") != "slurm":
        return []
    status = spec.get("slurm-status-command", "sacct")
    out = [
        f"Slurm: {tool} not found on PATH (run from a Slurm login node, or scripts/slurm-local-start.sh for the sandbox)"
        for tool in ("sbatch", "sinfo", status)
        if shutil.which(tool) is None
    ]
    if out:
        return out
    named = _named_resources(spec, cfg)
    nodes = _nodes()
    if not nodes:  # not "every rule too big": the controller did not answer
        return ["Slurm: sinfo listed no nodes (is slurmctld reachable from here? check SLURM_CONF and munge)"]
    threads = spec.get("set-threads") or {}
    missing: dict[str, list[str]] = {}
    for rule, res in named:
        part = res.get("slurm_partition")
        if part and part not in nodes:
            missing.setdefault(part, []).append(rule)
            continue
        largest = nodes[part] if part else {k: max((n[k] for n in nodes.values()), default=0) for k in ("cpus", "mem_mb", "gpus")}
        where = f"partition {part!r}" if part else "any partition"
        # gres is per node, gpu the whole job's (sbatch --gpus) over its nodes; CPUs: the rule's threads when
        # no cpus_per_task is set (the Slurm plugin's --cpus-per-task)
        n = cfg["parallel"]["nnodes"] if rule == f"train_{cfg['train']['backend']}" else 1
        asks = {
            "gpus": profiles.gres_gpus(res.get("gres")) or -(-int(res.get("gpu") or 0) // n),
            "cpus": res.get("cpus_per_task") or threads.get(rule),
            "mem_mb": res.get("mem_mb"),
        }
        for key, want in asks.items():
            if isinstance(want, int) and want > largest[key]:
                out.append(
                    f"Slurm: {rule} asks for {want} {key} a node, the largest node of {where} has {largest[key]} (fix: resources)"
                )
    for part, rules in missing.items():
        out.insert(
            0, f"Slurm: partition {part!r} ({', '.join(rules)}) does not exist; sinfo lists {sorted(nodes)} (fix: resources)"
        )
    accounts = {res["slurm_account"] for _, res in named if res.get("slurm_account")}
    known = _run(["sacctmgr", "-nP", "show", "account", "format=Account"]) if accounts else None
    if known is not None:
        for acct in sorted(accounts - set(known.split())):
            out.append(f"Slurm: account {acct!r} is not known to sacctmgr (fix: resources slurm_account)")
    return out


def accelerators(spec: dict, cfg: dict) -> list[str]:
    """Only where training runs on this host (the local executor)."""
    if spec.get("executor", "local") != "local":
        return []
    backend = cfg["train"]["backend"]
    if backend == "colossal":
        import torch

        from llmpipe.backends.colossal.train import GPU_ONLY

        plugin = cfg["colossal"]["plugin"]
        if plugin in GPU_ONLY and not torch.cuda.is_available():
            return [f"accelerator: colossal.plugin {plugin} trains here (local executor) but torch sees no CUDA device"]
    if backend == "neuron" and not list(Path("/dev").glob("neuron*")):
        return ["accelerator: the neuron backend trains here (local executor) but there is no /dev/neuron*"]
    if backend == "levanter" and cfg["levanter"].get("jax_platforms") == "tpu":
        exe = _interpreter(cfg["levanter"]["python"])
        found = exe and _run([exe, "-c", "import jax; print(len(jax.devices('tpu')))"])
        if not found:
            return ["accelerator: levanter.jax_platforms is tpu but JAX finds no TPU here (run on the TPU VM)"]
    return []


def credentials(cfg: dict) -> list[str]:
    """Presence only: no value is read into a message."""
    from llmpipe.data.mixture import paths as source_paths
    from llmpipe.hub import is_hub_ref

    out = []
    sources = [str(s) for s in source_paths(cfg["data"]["sources"])]
    s3 = [s for s in sources if s.startswith("s3://")]
    sm = cfg["train"]["backend"] == "sagemaker"
    if s3 or sm:
        import boto3

        if boto3.Session().get_credentials() is None:
            what = s3[0] if s3 else "the SageMaker job"
            out.append(f"credentials: no AWS credentials for {what} (fix: AWS_PROFILE, aws sso login, or an instance role)")
    real_aws = not os.environ.get("AWS_ENDPOINT_URL")  # an endpoint override (moto, LocalStack) takes any role
    for key in ("role_arn", "s3_prefix", "algorithm_name") if sm and real_aws else ():
        if any(mark in str(cfg["sagemaker"].get(key) or "") for mark in EXAMPLE_MARKS):
            out.append(f"credentials: sagemaker.{key} is the sagemaker profile's placeholder (fix: yours in your --configfile)")
    if cfg["hub"]["release"]["enabled"]:
        from huggingface_hub import get_token

        if not get_token():
            out.append("credentials: hub.release.enabled needs a Hub token with write access (fix: HF_TOKEN or hf auth login)")
    base = cfg["model"]["init_from"]
    if is_hub_ref(base) and str(base).removeprefix("hf://").split("/")[0] in GATED_ORGS:
        from huggingface_hub import get_token

        if not get_token():
            out.append(f"credentials: {base} is a gated model and no Hub token is set (fix: HF_TOKEN or hf auth login)")
    return out


def _patterns(cfg: dict) -> list[str]:
    """Local data.sources patterns, but those the run writes itself (hub.datasets as Parquet)."""
    from llmpipe.data.mixture import paths as source_paths

    made = Path(cfg["results_dir"]).as_posix() + "/"
    return [s for s in source_paths(cfg["data"]["sources"]) if "://" not in s and not s.startswith(("hf:", made))]


def _expand(pattern: str) -> list[str]:
    from llmpipe.data.sources import expand_sources

    try:
        return expand_sources([pattern])
    except FileNotFoundError:
        return []


def sources(cfg: dict) -> list[str]:
    """Local data.sources that match no file, or files get-data would stop on (a folder, unreadable, 0 bytes:
    under on_bad_record fail, or when no source is usable; get_data.check_sources)."""
    from llmpipe.data.get_data import check_sources
    from llmpipe.data.readers import BadSource

    found = {s: _expand(s) for s in _patterns(cfg)}
    out = [f"data: source {s!r} matches no file here (fix: data.sources)" for s, files in found.items() if not files]
    try:
        check_sources([f for files in found.values() for f in files], cfg["data"]["on_bad_record"])
    except BadSource as exc:
        out.append(f"data: {exc} (fix: data.sources)")
    return out


def _text_bytes(cfg: dict) -> int:
    """A bound on the text of the local sources (compressed files count 4x their size)."""
    total = 0
    for src in (f for pattern in _patterns(cfg) for f in _expand(pattern)):
        path = Path(src)
        if path.is_file():
            total += path.stat().st_size * (4 if path.suffix in (".gz", ".zst", ".zstd") else 1)
    return total


def view_bytes_per_token(view: str, cfg: dict) -> int:
    """Bytes a token takes in a view: hf its columns' (llmpipe.data.views.hf, the dtypes pack writes); the
    store, litgpt and megatron 2 or 4 by vocabulary (4 bounds both)."""
    if view != "hf":
        return 4
    from llmpipe.data.views import hf

    seg = "int16" if cfg["train"]["seq_len"] < 2**15 else "int32"  # as pack and verify choose it
    return hf.row_bytes(hf._columns(cfg["data"]["segment_ids"], seg), 1)


def disk_needed(cfg: dict, tokens: int | None, params: int | None) -> int:
    """Bytes the run writes: the token store and each view (data.views, and hf: the trainers and evaluate
    read it whatever data.views lists), the checkpoints kept (fp32 weights + AdamW's two moments: 12 bytes
    a parameter) and the export."""
    per_token = 4 + sum(view_bytes_per_token(v, cfg) for v in set(cfg["data"]["views"]) | {"hf"})
    data = (tokens or 0) * per_token
    t = cfg["train"]
    keep = t["keep_checkpoints"] + 1  # + final
    if t["backend"] == "levanter":  # Levanter keeps every save_interval step (keep: [{every: N}]), never prunes
        keep = t["max_steps"] // t["save_interval"] + 1
    model = (params or 0) * (12 * keep + 4)
    return data + model


def _config_parameters(cfg: dict) -> int | None:
    """The model's parameters from the config alone (its sizes and vocabulary, or a downloaded base's
    config.json), as the plan counts them; None where that needs a tokenizer not there yet."""
    from llmpipe.plan.arithmetic import parameters
    from llmpipe.plan.inputs import shape_from_config

    try:
        return parameters(shape_from_config(cfg, None)[0])
    except Exception:  # an estimate only: a tokenizer or base config it cannot read is named by its own job
        return None


def _sizes(cfg: dict, quick: bool) -> tuple[int, int | None]:
    """(tokens the run stores, model parameters or None): the plan's, or without it (quick, or no plan yet)
    the sources' text bytes / 2 and the parameters the config gives (the hook before a run's first job)."""
    if quick:
        return _text_bytes(cfg) // 2, _config_parameters(cfg)  # >= 2 text bytes a token
    from llmpipe.plan import cli as plan

    try:
        p = plan.build(cfg, allow_unknown_data=True)
    except (OSError, ValueError):  # no plan (e.g. a source missing, named by sources()): the quick bound
        p = {"data": {}, "model": {"parameters": None}}
    tokens = (p["data"].get("tokens_per_epoch") or 0) + (p["data"].get("val_tokens") or 0)
    return tokens or _text_bytes(cfg) // 2, p["model"]["parameters"]  # no tokenizer yet: the quick bound


def disk(cfg: dict, sizes: tuple[int, int | None]) -> list[str]:
    results = Path(cfg["results_dir"])
    need = disk_needed(cfg, *sizes)
    probe = results
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if need > free:
        return [f"disk: the run needs about {need / GIB:.1f} GiB under {results}, {free / GIB:.1f} GiB free (fix: results_dir)"]
    return []


# Steps that hold the whole model in float32 in one process: init_model for a new model or a base without
# safetensors weights (the base, then its save; a safetensors base streams tensor by tensor since 2026-12-02,
# tests/test_model_init.py) and evaluate with eval.stream_weights false (auto streams module by module where
# the model would not fit: tests/test_evaluate_streamed.py). Measured on a 252 M-parameter bf16 base: 7.4-7.8
# bytes a parameter peak RSS. (export_hf streams tensor by tensor since 2026-11-30: about 2x its largest tensor.)
WHOLE_MODEL_RULES = ("init_model", "evaluate")
WHOLE_MODEL_BYTES = 8


def whole_model_rules(cfg: dict) -> tuple[str, ...]:
    """WHOLE_MODEL_RULES but init_model where it streams its base: a Hub id (downloaded as safetensors, known
    to stream only once downloaded) or a local folder whose safetensors init_model would stream (asked of
    llmpipe.model.init.streamed: headers and a model on the meta device, no weights read); evaluate only with
    eval.stream_weights false."""
    from llmpipe.hub import is_hub_ref

    base = cfg["model"]["init_from"]
    if base and not is_hub_ref(base):
        from llmpipe.model.init import streamed

        try:
            streams = streamed(base) is not None
        except (OSError, ValueError):  # unreadable: init_model's own error; count it whole
            streams = False
    else:
        streams = bool(base)
    whole = tuple(r for r in WHOLE_MODEL_RULES if r != "init_model") if streams else WHOLE_MODEL_RULES
    return whole if cfg.get("eval", {}).get("stream_weights") is False else tuple(r for r in whole if r != "evaluate")


def memory(cfg: dict, spec: dict, params: int | None) -> list[str]:
    """Rules whose mem_mb (the profile's or the config's resources) is below what loading the whole model
    takes: Slurm would kill init_model before training, evaluate after it."""
    if not params:
        return []
    need_mb = (WHOLE_MODEL_BYTES * params + GIB) // 2**20
    res = dict(_named_resources(spec, cfg))
    short = [(r, res.get(r, res["default"]).get("mem_mb")) for r in whole_model_rules(cfg)]
    short = [(r, mb) for r, mb in short if str(mb).isdigit() and int(mb) < need_mb]  # mem_mb is MB (an int)
    if not short:
        return []
    given = ", ".join(f"{r} {mb}" for r, mb in short)
    fix = ", ".join(f"{r}: {{mem_mb: {need_mb}}}" for r, _ in short)
    return [
        f"memory: {given} MB, but these steps hold the whole model in float32 ({params / 1e9:.1f} B parameters: "
        f"about {need_mb} MB) (fix: resources: {{{fix}}})"
    ]


def problems(cfg: dict, spec: dict, quick: bool = False, envs: bool = True) -> list[str]:
    """Every problem line. spec: the profile's Snakemake settings (profiles.profile_settings); envs False where
    Snakemake builds the environments (--software-deployment-method conda)."""
    env = [*main_env(), *backend_env(cfg)] if envs else []
    sizes = _sizes(cfg, quick)
    return [
        *env,
        *executor(spec, cfg),
        *accelerators(spec, cfg),
        *credentials(cfg),
        *sources(cfg),
        *disk(cfg, sizes),
        *memory(cfg, spec, sizes[1]),
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="llmpipe doctor", description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="local", help="profile name (profiles/<name>) or folder")
    ap.add_argument("--configfile", nargs="+", action="extend", default=[], help="your config files, later wins")
    ap.add_argument("--config", dest="overrides", nargs="+", action="extend", default=[], metavar="KEY=VALUE")
    ap.add_argument("--quick", action="store_true", help="disk bound from the sources' sizes, no plan")
    args = ap.parse_args(argv)
    try:
        profile = profiles.profile_dir(args.profile)
        user = {}
        for f in args.configfile:
            user = profiles.merge(user, profiles._read_yaml(Path(f), "config file"))
        user = profiles.merge(user, overrides.from_entries(args.overrides))
        layered, _ = profiles.layered(user, profile if (profile / profiles.OVERLAY).is_file() else None)
        cfg = validate(layered)
    except ConfigError as exc:
        sys.exit(f"doctor: {exc}")
    found = problems(cfg, profiles.profile_settings(profile), args.quick)
    for line in found:
        print(line)
    print(f"doctor: profile {profile.name}: {len(found)} problem(s)" if found else f"doctor: profile {profile.name}: ready")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
