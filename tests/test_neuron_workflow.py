"""The neuron backend's rules end to end through Snakemake on CPU, with the Neuron parts faked.

Fakes, and why: Trainium, neuronx-cc and neuronx-distributed cannot run here, so NxD's trainer
(`tp_zero1_llama_hf_pretrain.py`, what pp 1 runs) is a stand-in (it records its flags and environment, loads the hf view as NxD does, and "trains" by
writing step_<max_steps> = pretrained shards + 0.5 with a `done` marker) and
`neuron_parallel_compile` is a shell script that runs its command with NEURON_EXTRACT_GRAPHS_ONLY=1
as the real one does for graph extraction. Everything else is real: data stages, init, neuron_shard,
the precompile / train commands through llmpipe.launch (torchrun, 2 processes) and neuron_merge
(export_hf / evaluate then read final/ as for every backend; the merged output loading in
transformers is checked in test_neuron_shard.py).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import REPO, REPO_IGNORE, corpus_docs, write_jsonl

SKIP = REPO_IGNORE
FAKE_TRAINER = r"""
import argparse, json, os, sys
from pathlib import Path
import datasets, torch
p = argparse.ArgumentParser()
for f in ("--checkpoint_dir", "--data_dir", "--max_steps", "--seq_len", "--checkpoint_freq"):
    p.add_argument(f)
p.add_argument("--pretrained_weight", action="store_true")
args, _ = p.parse_known_args()
if os.environ["RANK"] != "0":
    sys.exit(0)
phase = "precompile" if os.environ.get("NEURON_EXTRACT_GRAPHS_ONLY") == "1" else "train"
ckpt = Path(args.checkpoint_dir)
ds = datasets.load_from_disk(args.data_dir)
keep = ("NEURON_CC_FLAGS", "NEURON_EXTRACT_GRAPHS_ONLY", "XLA_DOWNCAST_BF16", "MALLOC_ARENA_MAX", "WORLD_SIZE", "PYTHONPATH")
record = {"argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in keep},
          "row_len": len(ds[0]["input_ids"]), "columns": sorted(ds.column_names),
          "rows": ds.num_rows, "first_ids": ds[0]["input_ids"]}
(ckpt.parent / f"fake_{phase}.json").write_text(json.dumps(record))
if phase == "train":
    step = ckpt / f"step_{args.max_steps}"
    (step / "model").mkdir(parents=True)
    for f in sorted((ckpt / "pretrained_weight" / "model").iterdir()):
        state = torch.load(f, weights_only=True)
        torch.save({k: v + 0.5 for k, v in state.items()}, step / "model" / f.name)
    (step / "checkpoint").write_text("1")
    (step / "done").write_text("1")
"""


@pytest.mark.slow
def test_neuron_dag_runs_end_to_end_with_a_fake_trainer(tmp_path):
    work = tmp_path / "repo"
    shutil.copytree(REPO, work, ignore=SKIP)
    script = tmp_path / "nxd/examples/training/llama/tp_zero1_llama_hf_pretrain/tp_zero1_llama_hf_pretrain.py"
    script.parent.mkdir(parents=True)
    script.write_text(FAKE_TRAINER)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "neuron_parallel_compile"
    wrapper.write_text('#!/bin/sh\nNEURON_EXTRACT_GRAPHS_ONLY=1 exec "$@"\n')
    wrapper.chmod(0o755)
    write_jsonl(tmp_path / "corpus.jsonl", corpus_docs(60))
    cfg = {
        "run": "t",
        "data": {"sources": [str(tmp_path / "corpus.jsonl")], "num_shards": 1, "val_fraction": 0.1},
        "tokenizer": {"source": "train", "vocab_size": 512},
        "model": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        },
        "train": {
            "backend": "neuron",
            "seq_len": 64,
            "global_batch_size": 2,
            "micro_batch_size": 2,
            "max_steps": 4,
            "save_interval": 2,
            "launcher": "local",
            "min_lr": 0.0,
            "eps": 1.0e-6,
        },
        "parallel": {"tp": 2, "pp": 1, "nproc_per_node": 2},
        "neuron": {
            "qkv_linear": True,
            "kv_size_multiplier": 1,
            "nxd_dir": str(tmp_path / "nxd"),
            "python": sys.executable,
            "compile_cache": str(tmp_path / "cache"),
            "cc_flags": ["--model-type=transformer", "-O1"],
        },
    }
    (work / "neuron.yaml").write_text(json.dumps(cfg))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(work / "src")}

    def snakemake(*args: str, timeout: int = 300) -> None:
        # --no-hooks: the Neuron environment is faked: llmpipe doctor's checks would (rightly) refuse it
        flags = ["--profile", "profiles/local", "--configfile", "neuron.yaml", "--no-hooks"]
        proc = subprocess.run(
            [sys.executable, "-m", "snakemake", *args, *flags], cwd=work, env=env, capture_output=True, text=True, timeout=timeout
        )
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    snakemake("results/t/checkpoints/neuron/final", timeout=900)
    run = work / "results/t"
    neuron = run / "checkpoints/neuron"

    pre, train = (json.loads((neuron / f"fake_{p}.json").read_text()) for p in ("precompile", "train"))
    from tests.test_neuron_commands import trainer_flags

    flags, pflags = (
        trainer_flags("tp_zero1_llama_hf_pretrain.py " + " ".join(shlex.quote(a) for a in r["argv"])) for r in (train, pre)
    )
    assert flags["--tensor_parallel_size"] == "2" and flags["--batch_size"] == "2" and flags["--max_steps"] == "4"
    assert flags["--grad_accum_usteps"] == "1" and "--pretrained_weight" in flags
    assert pflags["--steps_this_run"] == "10" and pflags["--checkpoint_freq"] == "-1"
    assert pre["env"]["NEURON_EXTRACT_GRAPHS_ONLY"] == "1" and train["env"]["NEURON_EXTRACT_GRAPHS_ONLY"] is None
    cc = f"--model-type=transformer -O1 --cache_dir={tmp_path / 'cache'}"
    assert pre["env"]["NEURON_CC_FLAGS"] == train["env"]["NEURON_CC_FLAGS"] == cc
    assert train["env"]["WORLD_SIZE"] == "2" and train["row_len"] == 64
    assert {"input_ids", "attention_mask", "labels"} <= set(train["columns"])
    marker = json.loads((neuron / "precompile.json").read_text())
    assert marker["cc_flags"] == cc and marker["compile_cache"] == str(tmp_path / "cache")
    assert json.loads((neuron / "train.json").read_text())["last_step"] == 4

    # merged (bf16) = init + 0.5, the fake training's update, in HF layout
    init = load_file(run / "checkpoints/init/model.safetensors")
    final = load_file(neuron / "final/model.safetensors")
    assert sorted(init) == sorted(final)
    for name, t in init.items():
        assert torch.equal(final[name], (t + 0.5).to(torch.bfloat16)), name
    assert json.loads((neuron / "final/config.json").read_text())["num_hidden_layers"] == 3
    assert (neuron / "final/tokenizer.json").is_file()

    def dry_run(**sections):
        changed = {k: {**cfg[k], **v} for k, v in sections.items()}
        (work / "neuron.yaml").write_text(json.dumps({**cfg, **changed}))
        cmd = [sys.executable, "-m", "snakemake", "results/t/checkpoints/neuron/final", "-n", "--profile", "profiles/local"]
        return subprocess.run(
            cmd + ["--configfile", "neuron.yaml"], cwd=work, env=env, capture_output=True, text=True, timeout=300
        )

    # a changed compiler flag reruns precompile and training (and what follows them)
    dry = dry_run(neuron={"cc_flags": ["--model-type=transformer", "-O2"]})
    assert dry.returncode == 0 and "rule neuron_precompile:" in dry.stdout and "rule neuron_shard:" not in dry.stdout
    assert "rule train_neuron:" in dry.stdout
    # the launch port is no setting of the model or the graphs: after a finished run it reruns nothing
    dry = dry_run(neuron={"master_port": 44001})
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:]

    # training rerun on a finished run (forced here; a rerun precompile does the same): nothing launched
    def force_train():
        (work / "neuron.yaml").write_text(json.dumps(cfg))
        snakemake("results/t/checkpoints/neuron/train.json", "--forcerun", "train_neuron")

    (neuron / "fake_train.json").unlink()
    force_train()
    again = json.loads((neuron / "train.json").read_text())
    assert again["launched"] is False and again["last_step"] == 4 and not (neuron / "fake_train.json").exists()

    # the fingerprint neuron-train recorded beside the steps is the one the workflow computes: a changed
    # setting stops the dry run before any job, and nothing is deleted (an unchanged one ran on above)
    from llmpipe.backends.neuron.resume import RECORD

    assert json.loads((neuron / "nxd" / RECORD).read_text())["fingerprint"]["neuron"]["tp"] == 2
    dry = dry_run(train={"lr": 0.0123})
    text = dry.stdout + dry.stderr
    assert dry.returncode != 0 and "has checkpoints trained with other settings (step_4: train.lr " in text, text[-3000:]
    assert (neuron / "nxd/step_4/done").is_file()
    # its ZeRO-1 optimizer state (a stand-in file, named as NxD names one per DP rank) under another DP: the
    # dry run stops too
    (neuron / "nxd/step_4/optim").mkdir()
    (neuron / "nxd/step_4/optim/dp_rank_00_tp_rank_00_pp_rank_00.pt").write_bytes(b"")
    dry = dry_run(parallel={"nproc_per_node": 4}, train={"micro_batch_size": 1})
    text = dry.stdout + dry.stderr
    assert dry.returncode != 0 and "optimizer state cut for data parallelism 1, but this run has DP 2" in text, text[-3000:]

    # resumed from step_2 (a stand-in: step_4 renamed), tp_zero1 reads the rows after step 2 (it skips none
    # itself): the view's rows from 2 steps x 2 rows on, and only the 2 steps' left
    import datasets

    (neuron / "nxd/step_4").rename(neuron / "nxd/step_2")
    force_train()
    again = json.loads((neuron / "fake_train.json").read_text())
    flags = trainer_flags("tp_zero1_llama_hf_pretrain.py " + " ".join(shlex.quote(a) for a in again["argv"]))
    assert flags["--data_dir"] == "results/t/checkpoints/neuron/nxd/llmpipe-resume-view/step_2/train"  # as the view: relative
    original = datasets.load_from_disk(str(run / "data/views/hf/train"))
    assert again["first_ids"] == original[2 * 2]["input_ids"] and again["rows"] == (4 - 2) * 2
    assert json.loads((neuron / "train.json").read_text())["last_step"] == 4
    assert not (neuron / "nxd/llmpipe-resume-view").exists()  # a finished run's view is removed
