# Config validation (before any job), run paths, backend selection, the llmpipe command.
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from llmpipe import backends
from llmpipe.config import ConfigError, validate
from llmpipe.data.readers import HF_PREFIX, expand_sources

try:
    validate(config)
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None

RUN = f"{config['results_dir']}/{config['run']}"
BACKEND = config["train"]["backend"]
if not Path(workflow.basedir, "rules", f"train_{BACKEND}.smk").is_file() or BACKEND not in backends.available():
    raise WorkflowError(
        f"unknown train.backend {BACKEND!r}; available: {', '.join(backends.available())}"
    )
SHARDS = [f"shard-{i:05d}" for i in range(config["data"]["num_shards"])]
# Every job runs `python -m llmpipe` from this checkout (no install needed inside conda envs).
shell.prefix(f"set -euo pipefail; export PYTHONPATH={Path(workflow.basedir) / 'src'}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; ")


def cfg_json(*sections):
    """The config sections a job reads, as JSON; a change there (and only there) reruns the job."""
    return json.dumps({s: config[s] for s in sections}, sort_keys=True)


def corpus_files(wildcards):
    """Local corpus files (globs expanded), so editing one reruns get_data; hf: sources are not files."""
    return expand_sources([s for s in config["data"]["sources"] if not s.startswith(HF_PREFIX)])


def tokenizer_inputs(wildcards):
    """Training a tokenizer reads the raw shards; copying a local one reads its tokenizer.json."""
    if config["tokenizer"]["source"] == "train":
        return expand(f"{RUN}/data/raw/{{shard}}.parquet", shard=SHARDS)
    return [f"{config['tokenizer']['source']}/tokenizer.json"]


def base_model_files(wildcards):
    """A local base model's config and weights (continued pre-training), so a change reruns init."""
    base = config["model"]["init_from"]
    if not base:
        return []
    weights = sorted(str(p) for p in Path(base).glob("*.safetensors")) or sorted(str(p) for p in Path(base).glob("*.bin"))
    return [f"{base}/config.json", *weights]
