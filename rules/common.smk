# Config validation (before any job), run paths, backend selection, the llmpipe command.
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from llmpipe import backends
from llmpipe.config import ConfigError, validate

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
# Every rule runs the package's CLI from this checkout (no install needed inside conda envs).
LLMPIPE = f"PYTHONPATH={Path(workflow.basedir) / 'src'}${{PYTHONPATH:+:$PYTHONPATH}} python -m llmpipe"


def cfg_json(*sections):
    """Only the config sections a rule uses, as JSON: a change there (and only there) reruns it."""
    return json.dumps({s: config[s] for s in sections}, sort_keys=True)


def tokenizer_inputs(wildcards):
    """Training a tokenizer reads the raw shards; copying a local one does not."""
    if config["tokenizer"]["source"] == "train":
        return expand(f"{RUN}/data/raw/{{shard}}.parquet", shard=SHARDS)
    return []
