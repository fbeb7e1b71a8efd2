"""Neuron backend, launch side: the precompile and training commands for the two trn1 presets.

Golden files (tests/golden/neuron/*.sh, reviewed by hand; regenerate with LLMPIPE_UPDATE_GOLDEN=1)
hold the environment and the exact srun + torchrun command each preset produces inside a 4- and
32-node Slurm job; independent checks parse them back: batch arithmetic, flag names the trainer
really reads, the compile wrapper around each node's command. No Neuron hardware or Slurm job is
involved: the allocation is given (hosts trn1-1..N, job 4242), as `scontrol` would report it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
import yaml

from llmpipe import config as cfgmod
from llmpipe import launch
from llmpipe.backends.neuron import commands
from tests.conftest import REPO, merge

GOLDEN = REPO / "tests" / "golden" / "neuron"
PRESETS = ["llama-2-7b-trn1", "llama-3-70b-trn1"]
RUN = "results/default"
# run_llama_nxd.py's argparse (tp/pp family, neuronx-distributed 2.29); it ignores anything else.
TRAINER_FLAGS = {
    "--num_microbatches", "--tensor_parallel_size", "--num_layer", "--hidden_size", "--train_batch_size",
    "--pipeline_parallel_size", "--virtual_pipeline_size", "--kv_replicator", "--seq_len", "--use_flash_attention",
    "--training_dir", "--training_config", "--trace_file_path", "--tb_dir", "--max_steps", "--checkpoint_freq",
    "--checkpoint_dir", "--loading_step", "--num_kept_checkpoint", "--save_load_xser", "--pretrained_weight",
    "--async_checkpoint_saving", "--use_gpu_compatible_precision", "--metrics_file", "--fuse_microbatches",
    "--weight_decay", "--beta1", "--beta2", "--use_fp32_optimizer", "--use_zero1_optimizer", "--seed", "--use_amp",
    "--use_deferred_init", "--use_meta_device_init", "--use_selective_checkpoint", "--use_sequence_parallel",
    "--deallocate_pipeline_outputs", "--qkv_linear", "--fuse_qkv", "--lr", "--warmup_steps", "--constant_steps",
    "--min_lr", "--logging_interval",
}


def preset(name: str, **over) -> dict:
    base = yaml.safe_load((REPO / "config/config.yaml").read_text())
    cfg = merge(base, yaml.safe_load((REPO / f"config/presets/{name}.yaml").read_text()))
    return cfgmod.validate(merge(cfg, over))


def build(cfg: dict, phase: str) -> str:
    hosts = [f"trn1-{i + 1}" for i in range(cfg["train"]["nnodes"])]
    alloc = launch.Allocation("4242", hosts, 128)
    args = commands.trainer_args(cfg, f"{RUN}/checkpoints/init", f"{RUN}/data/views/hf", f"{RUN}/checkpoints/neuron/nxd",
                                 f"{RUN}/train/nxd_metrics.json", f"{RUN}/train/tensorboard", phase)
    return commands.render(commands.environment(cfg), commands.command(cfg, args, alloc, phase, python="python"))


def trainer_flags(script: str) -> dict[str, str]:
    cmd = shlex.split(script.strip().splitlines()[-1])
    at = next(i for i, a in enumerate(cmd) if a.endswith("run_llama_nxd.py"))
    rest = cmd[at + 1:]
    return dict(zip(rest[::2], rest[1::2]))


@pytest.mark.parametrize("phase", ["train", "precompile"])
@pytest.mark.parametrize("name", PRESETS)
def test_commands_match_golden_files(name, phase):
    text = build(preset(name), phase)
    golden = GOLDEN / f"{name}.{phase}.sh"
    if os.environ.get("LLMPIPE_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


@pytest.mark.parametrize("name", PRESETS)
def test_golden_commands_hold_the_batch_arithmetic_and_real_flags(name):
    cfg = preset(name)
    t, n = cfg["train"], cfg["neuron"]
    train, comp = ((GOLDEN / f"{name}.{p}.sh").read_text() for p in ("train", "precompile"))
    flags = trainer_flags(train)
    assert set(flags) <= TRAINER_FLAGS, set(flags) - TRAINER_FLAGS
    assert not {"--pretrained_weight_dir", "--num_kept_checkpoints", "--convert_from_full_model"} & set(flags)
    dp = 32 * t["nnodes"] // (int(flags["--tensor_parallel_size"]) * int(flags["--pipeline_parallel_size"]))
    assert dp * int(flags["--train_batch_size"]) == t["global_batch_size"]
    if n["pp"] > 1:
        assert int(flags["--num_microbatches"]) * t["micro_batch_size"] == int(flags["--train_batch_size"])
    assert flags["--loading_step"] == "latest_if_exists" and flags["--pretrained_weight"] == "1"
    assert flags["--kv_replicator"] == str(n["kv_size_multiplier"]) and flags["--seq_len"] == str(t["seq_len"])
    assert flags["--training_dir"] == f"{RUN}/data/views/hf/train"
    # srun: one task per node; each runs llmpipe's node task (torchrun --nnodes/--node_rank from SLURM_NODEID)
    srun = shlex.split(train.strip().splitlines()[-1])
    assert srun[:6] == ["srun", "--overlap", "--kill-on-bad-exit=1", f"--nodes={t['nnodes']}",
                        f"--ntasks={t['nnodes']}", "--ntasks-per-node=1"]
    assert srun[srun.index("--master") + 1] == "trn1-1:44000" and srun[srun.index("--nproc-per-node") + 1] == "32"
    # precompile: the same command, each node's wrapped in neuron_parallel_compile, steps cut, no saving
    pre = shlex.split(comp.strip().splitlines()[-1])
    assert pre[pre.index("--cpus-per-task=128") + 1] == "neuron_parallel_compile"
    pflags = trainer_flags(comp)
    assert pflags.pop("--max_steps") == str(n["extract_steps"]) and pflags.pop("--checkpoint_freq") == "-1"
    assert {k: v for k, v in flags.items() if k not in ("--max_steps", "--checkpoint_freq")} == pflags
    assert train.splitlines()[:-1] == comp.splitlines()[:-1]  # same environment, same compile cache
    cc = next(line for line in train.splitlines() if line.startswith("export NEURON_CC_FLAGS="))
    assert "--cache_dir=results/neuron-compile-cache" in cc and "--model-type=transformer" in cc


def test_local_precompile_wraps_torchrun_and_s3_cache_uses_the_url():
    cfg = preset("llama-2-7b-trn1", train={"nnodes": 1, "global_batch_size": 4, "launcher": "local"},
                 neuron={"compile_cache": "s3://bucket/neuron-cache"})
    args = commands.trainer_args(cfg, "init", "view", "ckpt", "m.json", "tb", "precompile")
    cmd = commands.command(cfg, args, None, "precompile", python="py")
    assert cmd[:6] == ["neuron_parallel_compile", "py", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
    env = commands.environment(cfg)
    assert env["NEURON_COMPILE_CACHE_URL"] == "s3://bucket/neuron-cache" and "--cache_dir" not in env["NEURON_CC_FLAGS"]


@pytest.mark.parametrize("over, needle", [
    (dict(train={"micro_batch_size": 2}), "at neuron.pp 1 run_llama_nxd.py runs the per-replica batch (1 = global 16 / DP 16)"),
    (dict(train={"grad_clip": 0.5}), "clips gradients at 1.0"),
    (dict(train={"max_steps": 10500}), "max_steps 10500 must be a multiple of train.save_interval 1000"),
    (dict(train={"global_batch_size": 24}), "global_batch_size 24 must be a multiple of data parallelism 16"),
    (dict(train={"nnodes": 1}, neuron={"cores_per_node": 2}), "tp 8 x neuron.pp 1 must divide the 2 NeuronCores"),
])
def test_unmappable_settings_are_refused(over, needle):
    with pytest.raises(commands.NeuronConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        commands.check_config(preset("llama-2-7b-trn1", **over))


def snakemake_n(*args):
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, "-m", "snakemake", "-n", "--profile", "profiles/slurm-trn1", *args],
                          cwd=REPO, env=env, capture_output=True, text=True)


@pytest.mark.parametrize("name", PRESETS)
def test_dry_run_draws_the_whole_trn1_dag(name):
    r = snakemake_n("--configfile", f"config/presets/{name}.yaml")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    nodes = preset(name)["train"]["nnodes"]
    for rule in ("init_model", "neuron_shard", "neuron_precompile", "train_neuron", "neuron_merge", "export_hf", "evaluate"):
        assert f"rule {rule}:" in out, rule
    for rule in ("neuron_precompile", "train_neuron"):
        block = out[out.index(f"rule {rule}:"):].split("\n\n")[0]
        assert f"nodes={nodes}, tasks={nodes}" in block and "slurm_extra=--exclusive" in block


def test_dry_run_stops_on_an_invalid_layout_before_any_job(tmp_path):
    over = tmp_path / "kvm.yaml"
    over.write_text("neuron: {kv_size_multiplier: 2}\n")
    r = snakemake_n("--configfile", "config/presets/llama-3-70b-trn1.yaml", str(over))
    assert r.returncode != 0
    assert "kv_size_multiplier 2 must equal tp / num_key_value_heads = 4" in r.stdout + r.stderr
