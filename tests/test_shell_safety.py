"""No config value or file name reaches a shell unquoted: the whole workflow runs with `$()`, backticks,
`;`, both quotes and spaces in results_dir, the corpus file name and the tokenizer folder, and nothing
those strings would run happens (no PWNED file appears); a run name with them is refused by the schema."""

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.conftest import GPT2, REPO, REPO_IGNORE, corpus_docs, write_jsonl

NASTY = "a b;$(touch PWNED1) `touch PWNED2`; 'q\" $HOME"


@pytest.mark.slow
def test_workflow_runs_with_shell_metacharacters_in_every_path(tmp_path):
    work = tmp_path / "repo"
    shutil.copytree(REPO, work, ignore=REPO_IGNORE, symlinks=True)
    corpus = write_jsonl(work / f"corpus {NASTY}.jsonl", corpus_docs(40))
    tok = work / f"tok {NASTY}"
    shutil.copytree(GPT2, tok)
    results = f"results {NASTY}"
    cfg = {
        "results_dir": results,
        "data": {"sources": [str(corpus)], "num_shards": 2, "val_fraction": 0.1},
        "tokenizer": {"source": str(tok)},
        "model": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        },
        "train": {
            "seq_len": 64,
            "global_batch_size": 4,
            "micro_batch_size": 4,
            "max_steps": 3,
            "warmup_steps": 1,
            "save_interval": 3,
            "eval_interval": 3,
            "threads": 1,
        },
    }
    (work / "nasty.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", "local", "--configfile", "nasty.yaml"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert not list(tmp_path.rglob("PWNED*")), list(tmp_path.rglob("PWNED*"))
    run = work / results / "default"
    ev = json.loads((run / "eval.json").read_text())
    assert ev["tokens"] > 0 and (run / "hf" / "model.safetensors").is_file()
    sources = json.loads((run / "data" / "sources.json").read_text())
    assert str(corpus) in [v for src in sources["sources"] for v in src.values()]  # read under its real name
    assert not [p for p in work.iterdir() if p.name.startswith(("results ", "a b"))][1:]  # no stray split paths


@pytest.mark.parametrize("run", ["x$(touch PWNED)", "x`id`", "a;b", "a b", "q'"])
def test_run_names_with_shell_characters_are_refused(tmp_path, run):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"run": run}))
    proc = subprocess.run(
        [sys.executable, "-m", "llmpipe", "check-config", "c.yaml"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode != 0 and "'run'" in proc.stderr
    assert not list(tmp_path.rglob("PWNED*"))


@pytest.mark.parametrize("profile", ["slurm-trn1", "gpu-colossal", "tpu", "sagemaker", "slurm-local"])
def test_every_backends_commands_keep_nasty_paths_whole(tmp_path, profile):
    """Dry run of each backend's DAG with the nasty results_dir: every printed command, split as a shell
    splits it, carries the path whole in single arguments (nothing of it is ever a separate word)."""
    import re
    import shlex

    results = f"{tmp_path}/r {NASTY}"
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "-p", "--profile", profile, "--config", f"results_dir={results}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    commands = [c for c in re.findall(r"^Shell command: (.*)$", proc.stdout, re.M) if c != "None"]
    assert len(commands) >= 8

    def strings(v):
        if isinstance(v, dict):
            return [x for i in v.values() for x in strings(i)]
        return [x for i in v for x in strings(i)] if isinstance(v, list) else [v] if isinstance(v, str) else []

    for cmd in commands:
        words = []
        for w in shlex.split(cmd):  # a JSON --config argument: its string values
            words += strings(json.loads(w)) if w.startswith("{") else [w]
        hits = [w for w in words if "PWNED" in w or "$HOME" in w]
        assert hits, cmd[:300]
        assert all(NASTY in w for w in hits), [w for w in hits if NASTY not in w]
