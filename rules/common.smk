# Config layers and validation (before any job), run paths, backend selection, the llmpipe command.
import copy
import functools
import json
import os
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from llmpipe import backends, overrides, profiles, run_identity
from llmpipe.config import ConfigError, validate
from llmpipe.data.cuts import cut_files, splits
from llmpipe.data.mixture import is_mixture, paths as source_paths
from llmpipe.data.pack_views import FORMAT_KEYS, PACKED, VIEW_KEYS
from llmpipe.data.readers import HF_PREFIX
from llmpipe.data.tokenizer import TOKENIZER_FILES
from llmpipe.data.tokenize import num_jobs as tokenize_jobs, shards_per_job
from llmpipe.hub import is_hub_ref
from llmpipe.hub.download import moved_since
from llmpipe.train.resume import RESUME_NEUTRAL, changed_settings
from llmpipe.data.sources import expand_sources, stat_digest
from llmpipe.data.remote_keys import digest as remote_digest, is_remote, remote_identities

# defaults < preset < the profile's llmpipe.yaml < your --configfile / --config (llmpipe/profiles.py)
try:
    PROFILE = profiles.active_profile(profiles.snakemake_argv())
    # --config values typed by the schema (Snakemake leaves 'train={max_steps: 160}' a string); files as written
    _user = overrides.user_layer(workflow.config_settings.overwrite_config, workflow.config_settings.config_args)
    layered, CONFIG_LAYERS = profiles.layered(_user, PROFILE, Path(workflow.basedir))
    config.clear()
    config.update(layered)
    validate(config)
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None
if PROFILE is not None:
    os.environ[profiles.PROFILE_ENV] = str(PROFILE)  # cluster jobs inherit it (sbatch --export=ALL)

RUN = f"{config['results_dir']}/{config['run']}"
# results/<run>/ is for one model, tokenizer and backend (llmpipe/run_identity.py): recorded when a run starts
_IDENTITY_CONFIG = copy.deepcopy(config)  # before tokenizer.source "base" becomes a path below
if workflow.is_main_process:  # cluster jobs run under the identity their main process checked
    _clash = run_identity.clash(config, Path(RUN))
    if _clash:
        raise WorkflowError(_clash)
BACKEND = config["train"]["backend"]  # validated: one of llmpipe.backends.available()
BACKEND_RULES = str(backends.get(BACKEND).rules_file())
_backend = backends.get(BACKEND)
if _backend.resume_sections:  # before Snakemake deletes the old model to train again
    _changed = changed_settings(
        config, Path(RUN) / "checkpoints" / BACKEND, config["run"], _backend.resume_sections(config), _backend.newest_state
    )
    if _changed:
        raise WorkflowError(_changed)
if _backend.resume_refusal:  # e.g. NxD's ZeRO-1 optimizer state under another DP
    _refused = _backend.resume_refusal(config, Path(RUN) / "checkpoints" / BACKEND)
    if _refused:
        raise WorkflowError(f"run {config['run']!r}: {_refused}")

# every view a job of this run reads, so verify_data checks each: data.views, hf (plan and evaluate read it,
# the torch, colossal and neuron trainers train on it) and a SageMaker algorithm's litgpt
VIEWS = sorted(
    {
        *config["data"]["views"],
        "hf",
        *(["litgpt"] if BACKEND == "sagemaker" and config["sagemaker"]["mode"] == "algorithm" else []),
    }
)
# view keys only formats this run does not build read: no job is given them (a change reruns nothing)
UNBUILT = tuple(f"data.{k}" for k in VIEW_KEYS if all(k not in FORMAT_KEYS[f] for f in VIEWS))
# Every job runs `python -m llmpipe` from this checkout (no install needed inside conda envs).
# Paths and config values reach the shell only quoted (`:q` in every rule, shlex.quote here).
SRC = shlex.quote(str(Path(workflow.basedir) / "src"))
TO_LOGS = 'to_logs() {{ printf \'== attempt started %s on %s\\n\' "$(date -u +%FT%TZ)" "$(hostname)" >> "$1"; tee -a "$1"; }}; '
shell.prefix(f"set -euo pipefail; export PYTHONPATH={SRC}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; {TO_LOGS}")


def cfg_json(*keys, drop=()):
    """The config keys a job reads ("data", "train.seq_len"), as JSON: a change there (and only there) reruns it.
    `drop`: keys of a whole section given that the job does not read ("data.shuffle_seed")."""
    out = {}
    for key in keys:
        section, _, name = key.partition(".")
        if name:
            out.setdefault(section, {})[name] = config[section][name]
        else:
            value = config[section]
            out[section] = {k: v for k, v in value.items() if f"{section}.{k}" not in drop} if isinstance(value, dict) else value
    text = json.dumps(out, sort_keys=True)
    return lambda wildcards: text  # a function: Snakemake must not read {...} in values as wildcards


# Settings a trainer reads that do not change the trained model (llmpipe.train.resume.RESUME_NEUTRAL,
# train.resume aside: setting it false restarts the run) and validation's batch settings (metrics only;
# the last two are llmpipe evaluate's).
TRAIN_NEUTRAL = (
    *(f"train.{k}" for k in sorted(RESUME_NEUTRAL - {"resume"})),
    "eval.batch_size",
    "eval.max_batches",
    "eval.final_max_batches",
    "eval.stream_weights",
)


def train_cfg_json(*keys, keep=(), neutral=()):
    """A training rule's params for config `keys`: `settings`, its rerun trigger (TRAIN_NEUTRAL but `keep`,
    and the backend's own `neutral` keys, left out), and `cfg`, all of them for the command, given as a function of `input`: Snakemake leaves
    such derived params out of its params trigger, so changing train.log_interval, threads, keep_checkpoints,
    ... after a run reruns no training (before: training, export and evaluation again)."""
    text = cfg_json(*keys)(None)
    return {
        "settings": cfg_json(*keys, drop=(*(k for k in TRAIN_NEUTRAL if k not in keep), *neutral)),
        "cfg": lambda wildcards, input: text,
    }


def attempts_log(rule_name):
    """A training rule's history of attempts: its shell ends `2>&1 | to_logs {params.attempts:q} > {log:q}`
    (to_logs: the shell prefix), its output in its log and appended here after one header line per attempt:
    Snakemake removes a job's log before each run, so a failed attempt's log (a Slurm retry's, an
    interrupted run's) was gone once the next one began."""
    return f"{RUN}/logs/{rule_name}.attempts.log"


def view_cfg(wildcards):
    """pack's config for one view format: only what its files depend on (pack_views.FORMAT_KEYS), so a
    setting of another format neither reruns it nor changes its fingerprint."""
    fmt = wildcards.fmt
    train = {"seq_len": config["train"]["seq_len"]} if fmt in PACKED else {}
    data = {k: config["data"][k] for k in FORMAT_KEYS[fmt]}
    return json.dumps({"run": config["run"], "data": data, "train": train}, sort_keys=True)


def local_corpus():
    """(files rule download_dataset writes, the user's local corpus files with globs expanded; paths and
    file:// URLs)."""
    local = [s for s in source_paths(config["data"]["sources"]) if not is_remote(s)]
    made = [s for s in local if s in HUB_DATASETS.values()]
    return made, expand_sources([s for s in local if s not in made])


def check_local_sources():
    """A local data.sources path or glob that matches no file: one line at planning, not a traceback from the
    input functions that expand it (get_data's, tokenize's)."""
    try:
        local_corpus()
    except FileNotFoundError as exc:
        raise WorkflowError(f"{exc} (fix: data.sources; `llmpipe doctor` checks the sources)") from None


def local_hf_files():
    """Every file of an hf: source that is a local dataset folder (or file): edits there rerun get_data."""
    found = [s[len(HF_PREFIX) :] for s in source_paths(config["data"]["sources"]) if s.startswith(HF_PREFIX)]
    found = [Path(f) for f in found if os.path.exists(f)]
    return [str(p) for f in found for p in ([f] if f.is_file() else sorted(f.rglob("*"))) if p.is_file()]


def source_count():
    """How many sources get-data will list, as far as planning can see: local globs expanded, an hf:
    dataset or a remote file 1, a remote glob as many as shards (listing it needs the network)."""
    try:
        made, given = local_corpus()
    except FileNotFoundError:  # named by the rules that read it
        return config["data"]["num_shards"]
    rest = [s for s in source_paths(config["data"]["sources"]) if is_remote(s)]
    many = any("*" in s or "?" in s or "[" in s or "{" in s for s in rest if not s.startswith(HF_PREFIX))
    return config["data"]["num_shards"] if many else len(made) + len(given) + len(rest)


@functools.cache
def cut_corpus():
    """(local corpus files get-data cuts into byte ranges (data.range_split_bytes), every source is one): as
    get-data decides (cuts.cut_files; fewer sources than shards, counted as source_count does)."""
    try:
        made, given = local_corpus()
    except FileNotFoundError:
        return [], False
    if source_count() >= config["data"]["num_shards"]:
        return [], False
    cut = cut_files(config["data"], given, {})
    remote = any(map(is_remote, source_paths(config["data"]["sources"])))
    return cut, bool(cut) and not remote and not made and len(cut) == len(given)


def cut_sources_only():
    """Every source is a file get-data cuts: each shard reads only its own range, so a job a shard still reads
    each byte once (and skips one job feeding worker processes)."""
    return cut_corpus()[1]


def corpus_files(wildcards):
    """Local corpus files (globs expanded, file:// URLs, local hf: folders' files), so editing one reruns
    get_data. URLs and Hub datasets are not listed (no network at parse time): get_data fingerprints
    them (ETag / size) instead."""
    made, given = local_corpus()
    return made + given + local_hf_files()


def corpus_stat(wildcards):
    """A digest of the user's local corpus files' size, mtime, ctime and inode (an edit that restores the
    mtime still changes it: llmpipe.data.sources.stat_digest). Files this workflow writes are left out.
    Where get-data cut a file into byte ranges before 2026-11-30 (by size alone, a limit or blank lines aside), a
    mark: such a sources.json (records numbered by index) reruns get_data once, and then stays as it is."""
    given = local_corpus()[1]
    n = config["data"]["num_shards"]
    old = source_count() < n and splits({**config["data"], "max_records_per_source": None}, given, {})
    return stat_digest(given + local_hf_files()) + (" cut at line starts" if old else "")


@functools.cache
def remote_sources():
    """Identity of the remote sources now (ETag / version id; Hub commit), asked once per planning."""
    ids, warnings = remote_identities(
        source_paths(config["data"]["sources"]), config["data"], config["hub"]["datasets"], config["hub"]["endpoint"]
    )
    for warning in warnings:
        print(f"llmpipe: warning: {warning}", file=sys.stderr)
    return ids


def corpus_remote(wildcards):
    """A digest of remote_sources(): an overwritten object or a moved Hub revision reruns get_data."""
    return remote_digest(remote_sources()) if any(map(is_remote, source_paths(config["data"]["sources"]))) else ""


def dataset_commit(wildcards):
    """The commit a hub.datasets entry's revision points to now: a moved branch downloads again."""
    (spec,) = [d for d in config["hub"]["datasets"] if d["name"] == wildcards.name]
    mine = (spec["id"], spec.get("revision"))  # not another entry's (or an hf: source's) revision of that id
    return next((x.get("commit") or "" for x in remote_sources() if (x.get("hub"), x.get("revision")) == mine), "")


def tokenizer_inputs(wildcards):
    """Training a tokenizer reads the sources; copying a local one reads its tokenizer.json; a Hub id has none."""
    if config["tokenizer"]["source"] == "train":
        return [f"{RUN}/data/sources.json"]
    if Path(config["tokenizer"]["source"]) == Path(HUB_BASE):  # the downloaded base model's own tokenizer
        return [HUB_BASE]
    if is_hub_ref(config["tokenizer"]["source"]):  # downloaded by the job itself
        return []
    # every file the copy reads (tokenizer_config.json holds the EOS token): an edit reruns the tokenizer
    return [
        f"{config['tokenizer']['source']}/{name}"
        for name in TOKENIZER_FILES
        if Path(config["tokenizer"]["source"], name).is_file()
    ] or [f"{config['tokenizer']['source']}/tokenizer.json"]


# Hub inputs (rules/hub.smk): a Hub id in model.init_from is downloaded to HUB_BASE first; hub.datasets
# are materialised as Parquet files (list those paths in data.sources).
HUB_BASE = f"{RUN}/checkpoints/base"
# asked by the main process only: a cluster job's node may have no network (and the answer changes nothing)
if workflow.is_main_process and is_hub_ref(config["model"]["init_from"]):
    if _moved := moved_since(HUB_BASE, config["hub"]["endpoint"]):
        print(f"llmpipe: warning: {_moved}", file=sys.stderr)  # kept, not downloaded again (moved_since says why)
HUB_DATASETS = {d["name"]: f"{RUN}/data/hub/{d['name']}.parquet" for d in config["hub"]["datasets"]}
# Tokenize jobs: fewer sources than shards (every shard reads every source) -> one job reading each source
# once for all shards, its threads encoding, unless every source is cut into byte ranges; otherwise
# data.shards_per_job (null: at most 64 jobs, at least data.min_shards_per_job).
SOURCE_COUNT = source_count()  # globs expanded once per parse
SHARDS_PER_JOB = shards_per_job(config["data"], config["data"]["num_shards"] if cut_sources_only() else SOURCE_COUNT)
TOKENIZE_JOBS = [f"{j:05d}" for j in range(tokenize_jobs(config["data"], per_job=SHARDS_PER_JOB))]
_CORES = getattr(workflow.global_resources.get("_cores"), "value", None) or os.cpu_count() or 1
TOKENIZE_THREADS = min(SHARDS_PER_JOB, _CORES) if len(TOKENIZE_JOBS) == 1 else 1
# get_data counts a mixture's (weighted sources') files before tokenizing: one process per file at once, as
# many as a data job has cores: the profile's threads for tokenize where it sets them (a cluster's data nodes;
# cores here are the head node's, or 1 in a dry run), else the cores here.
_SET_TOKENIZE = workflow.resource_settings.overwrite_threads.get("tokenize")
if hasattr(_SET_TOKENIZE, "is_evaluable"):  # a Resource: a number, or an expression known only per job
    _SET_TOKENIZE = None if _SET_TOKENIZE.is_evaluable() else _SET_TOKENIZE.value
_DATA_CORES = _SET_TOKENIZE if isinstance(_SET_TOKENIZE, int) and _SET_TOKENIZE > 0 else _CORES
GET_DATA_THREADS = min(SOURCE_COUNT, _DATA_CORES) if is_mixture(config["data"]["sources"]) else 1
if config["tokenizer"]["source"] == "base":  # the base model's own tokenizer (continued pre-training)
    config["tokenizer"]["source"] = HUB_BASE if is_hub_ref(config["model"]["init_from"]) else config["model"]["init_from"]


def init_from():
    """model.init_from as init_model reads it: the downloaded folder for a Hub id."""
    base = config["model"]["init_from"]
    return HUB_BASE if is_hub_ref(base) else base


def init_cfg_json(*keys):
    """cfg_json with model.init_from replaced by the folder init_model loads."""
    text = json.loads(cfg_json(*keys)(None))
    if "model" in text and text["model"].get("init_from"):
        text["model"]["init_from"] = init_from()
    text = json.dumps(text, sort_keys=True)
    return lambda wildcards: text


def base_model_files(wildcards):
    """A local base model's config and weights (continued pre-training), so a change reruns init."""
    base = config["model"]["init_from"]
    if not base:
        return []
    if is_hub_ref(base):
        return [HUB_BASE]
    # every file from_pretrained reads: config, generation config, weights and their index (not tokenizer files)
    patterns = ("generation_config.json", "*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json")
    files = sorted({str(p) for pat in patterns for p in Path(base).glob(pat) if p.is_file()})
    return [f"{base}/config.json", *files]


def launch_prefix(python="python"):
    """The training launch (llmpipe.launch): python, torchrun, or srun + torchrun per node, all
    started with `python` (a backend environment's interpreter runs the launcher and what it starts).
    It holds the run's trainer lock (one trainer per checkpoint folder) and dies with snakemake."""
    t, p = config["train"], config["parallel"]
    resume = " --auto-resume" if t["slurm_auto_resume"] else ""  # HyperPod: srun --auto-resume=1
    lock = shlex.quote(f"{RUN}/checkpoints/{BACKEND}")
    return (
        f"{shlex.quote(python)} -m llmpipe launch --nproc-per-node {p['nproc_per_node']} --nnodes {p['nnodes']}"
        f" --launcher {t['launcher']}{resume} --lock {lock}"
    )


def colossal_launch():
    """Launch for train_colossal, ending in `-m` (the module follows): llmpipe.launch run by the
    ColossalAI env's interpreter (so torchrun and srun's per-node launch start that interpreter), or
    `colossalai run --hostfile` (colossal.launcher: colossalai), which starts `torchrun` from PATH."""
    c, p = config["colossal"], config["parallel"]
    py = shlex.quote(c["python"])
    if c["launcher"] == "colossalai":
        hosts = f" --hostfile {shlex.quote(c['hostfile'])}" if c["hostfile"] else ""
        return (
            f'bin=$({py} -c "import os, sys; print(os.path.dirname(sys.executable))"); PATH=$bin:$PATH'
            f" $bin/colossalai run --nproc_per_node {p['nproc_per_node']} --num_nodes {p['nnodes']}{hosts}"
            f" --master_port {c['master_port']} -m"
        )
    return launch_prefix(c["python"]) + " -- -m"


def train_resources():
    """Nodes of the training job: one task per node (sbatch --nodes N --ntasks N). GPU jobs get no
    --ntasks-per-gpu (tasks_per_gpu 0), so Slurm's default of one task per node holds there too."""
    n = config["parallel"]["nnodes"]
    return {"nodes": n, "tasks": n, "tasks_per_gpu": 0}


def check_profile_resources():
    """A profile sized for another trainer is an error, not a run of this one on its nodes: every
    training-backend rule the profile's set-resources names must be in this workflow."""
    named = set(workflow.resource_settings.overwrite_resources or {})
    owners = backends.rules_by_backend()
    missing = sorted(r for b, rs in owners.items() if b != BACKEND for r in rs if r in named)
    if missing:
        given = profiles.snakemake_profiles(profiles.snakemake_argv() or [])
        where = f"profile {(PROFILE or given[-1]).name!r}" if PROFILE or given else "the profile's set-resources"
        raise WorkflowError(
            f"{where} gives resources to {', '.join(missing)} (train.backend "
            f"{', '.join(sorted({b for b, rs in owners.items() for r in rs if r in missing}))}), but this config trains "
            f"with train.backend {BACKEND!r} (rules {', '.join(owners.get(BACKEND, []))}): use the profile made for "
            f"{BACKEND!r}, or set train.backend to the profile's (README: Run on your hardware)"
        )


def apply_config_resources():
    """Config `resources:` on top of every rule's resources, the profile's set-resources included
    (a profile's set-resources would otherwise beat anything a rule declares). Call after all rules."""
    res = config["resources"]  # rule names checked by llmpipe.config.validate
    for r in workflow.rules:
        values = {**res.get("default", {}), **res.get(r.name, {})}
        if r.name == f"train_{BACKEND}":
            values.update(res.get("train", {}))
        if values:
            r.resources.update(values)


def check_slurm_extra():
    """An sbatch option the Slurm plugin sets itself, in any rule's slurm_extra (profile or config): refused
    here, not by the plugin when it submits that job, after every job before it. Call after all rules."""
    extras = {r.name: profiles.resource_text(r.resources.get("slurm_extra")) for r in workflow.rules}
    found = profiles.slurm_extra_problems({k: v for k, v in extras.items() if v})
    if found:
        raise WorkflowError("\n".join(found))


def check_train_gpus():
    """One training process a GPU: refused here when a node's processes outnumber its gres GPUs."""
    train = next((r for r in workflow.rules if r.name == f"train_{BACKEND}"), None)
    gres = profiles.resource_text(train.resources.get("gres")) if train else None
    problem = profiles.gpu_problem(BACKEND, config["parallel"]["nproc_per_node"], gres)
    if problem:
        raise WorkflowError(problem)


def executor_name() -> str | None:
    """The executor jobs run under; on a dry run, the one the command line or the last profile names."""
    name = getattr(workflow.executor_plugin, "name", None)
    return profiles.named_executor(profiles.snakemake_argv() or []) if name == "dryrun" else name


def train_time_limit(wildcards=None) -> str:
    """plan's --time-limit: the training rule's runtime (minutes) and attempts (retries + 1), where the
    executor ends a job at its runtime (Slurm); empty elsewhere or without a runtime."""
    train = next((r for r in workflow.rules if r.name == f"train_{BACKEND}"), None)
    minutes = profiles.runtime_minutes(train.resources.get("runtime")) if train else None
    if minutes is None or executor_name() != "slurm":
        return ""
    return f"--time-limit {minutes:g} --attempts {train.restart_times + 1} --train-rule {train.name}"


def write_dag_info():
    """For `llmpipe dag`: the resolved config and the rules that run on the submitting host."""
    target = os.environ.get("LLMPIPE_DAG_INFO")
    if target and not workflow.remote_exec:
        info = {
            "config": config,
            "backend": BACKEND,
            "profile": str(PROFILE) if PROFILE else None,
            "local_rules": sorted(r.name for r in workflow.rules if r.name in workflow._localrules or r.norun),
        }
        Path(target).write_text(json.dumps(info, default=str))


def record_run_identity():
    """results/<run>/run-identity.json, when the first job is about to start (not on a dry run)."""
    try:
        run_identity.record(_IDENTITY_CONFIG, Path(RUN))
    except run_identity.IdentityClash as exc:
        raise WorkflowError(str(exc)) from None


def doctor_before_jobs():
    """llmpipe doctor's checks (quick disk bound) before the first job of a non-dry run: a missing
    environment, Slurm piece or credential stops here, never after a GPU allocation (--no-hooks skips)."""
    if workflow.remote_exec:
        return
    from snakemake.settings.types import DeploymentMethod
    from llmpipe import doctor

    named = profiles.snakemake_profiles(profiles.snakemake_argv() or [])
    spec = {**profiles.profile_settings(named[-1] if named else None), "executor": workflow.executor_plugin.name}
    built = DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method  # envs from envs/*.yaml
    found = doctor.problems(config, spec, quick=True, envs=not built)
    if found:
        lines = "\n".join(found)
        raise WorkflowError(f"llmpipe doctor: {len(found)} problem(s) before any job:\n{lines}")


onstart:
    doctor_before_jobs()
    record_run_identity()
