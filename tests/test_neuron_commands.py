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
PRESETS = ["llama-2-7b-trn1", "llama-3-70b-trn1", "llama-3-70b-trn2"]
RUN = "results/default"
# run_llama_nxd.py's argparse (tp/pp family, neuronx-distributed 2.29); it ignores anything else.
TRAINER_FLAGS = {
    "--num_microbatches",
    "--tensor_parallel_size",
    "--num_layer",
    "--hidden_size",
    "--train_batch_size",
    "--pipeline_parallel_size",
    "--virtual_pipeline_size",
    "--kv_replicator",
    "--seq_len",
    "--use_flash_attention",
    "--training_dir",
    "--training_config",
    "--trace_file_path",
    "--tb_dir",
    "--max_steps",
    "--checkpoint_freq",
    "--checkpoint_dir",
    "--loading_step",
    "--num_kept_checkpoint",
    "--save_load_xser",
    "--pretrained_weight",
    "--async_checkpoint_saving",
    "--use_gpu_compatible_precision",
    "--metrics_file",
    "--fuse_microbatches",
    "--weight_decay",
    "--beta1",
    "--beta2",
    "--use_fp32_optimizer",
    "--use_zero1_optimizer",
    "--seed",
    "--use_amp",
    "--use_deferred_init",
    "--use_meta_device_init",
    "--use_selective_checkpoint",
    "--use_sequence_parallel",
    "--deallocate_pipeline_outputs",
    "--qkv_linear",
    "--fuse_qkv",
    "--lr",
    "--warmup_steps",
    "--constant_steps",
    "--min_lr",
    "--logging_interval",
}


# tp_zero1_llama_hf_pretrain.py's argparse (same release): valued flags, then store_true switches.
ZERO1_FLAGS = {
    "--model_path",
    "--data_dir",
    "--output_dir",
    "--metrics_file",
    "--batch_size",
    "--max_steps",
    "--steps_this_run",
    "--seed",
    "--lr",
    "--warmup_steps",
    "--grad_accum_usteps",
    "--tensor_parallel_size",
    "--context_parallel_size",
    "--seq_len",
    "--num_layers",
    "--logging_interval",
    "--kv_replicator",
    "--use_gpu_compatible_precision",
    "--weight_decay",
    "--beta1",
    "--beta2",
    "--checkpoint_freq",
    "--checkpoint_dir",
    "--loading_step",
    "--num_kept_checkpoint",
    "--hidden_size",
    "--use_flash_attention",
    "--fuse_qkv",
    "--transpose_nki_inputs",
}
ZERO1_SWITCHES = {
    "--print_grad_norm",
    "--use_mix_precision",
    "--use_zero_1",
    "--sequence_parallel_enabled",
    "--selective_checkpoint_enabled",
    "--use_meta_device_init",
    "--qkv_linear",
    "--pretrained_weight",
}


def preset(name: str, **over) -> dict:
    base = yaml.safe_load((REPO / "config/config.yaml").read_text())
    cfg = merge(base, yaml.safe_load((REPO / f"config/presets/{name}.yaml").read_text()))
    return cfgmod.validate(merge(cfg, over), whole=False)  # check_config itself is under test


def build(cfg: dict, phase: str) -> str:
    hosts = [f"trn1-{i + 1}" for i in range(cfg["parallel"]["nnodes"])]
    alloc = launch.Allocation("4242", hosts, 128)
    args = commands.trainer_args(
        cfg,
        f"{RUN}/checkpoints/init",
        f"{RUN}/data/views/hf",
        f"{RUN}/checkpoints/neuron/nxd",
        f"{RUN}/train/nxd_metrics.json",
        f"{RUN}/train/tensorboard",
        phase,
    )
    return commands.render(commands.environment(cfg), commands.command(cfg, args, alloc, phase, python="python"))


def trainer_flags(script: str) -> dict[str, str | None]:
    """The trainer's flags in a rendered command; a store_true switch maps to None."""
    cmd = shlex.split(script.strip().splitlines()[-1])
    at = next(i for i, a in enumerate(cmd) if a.endswith(("run_llama_nxd.py", "tp_zero1_llama_hf_pretrain.py")))
    rest, out, i = cmd[at + 1 :], {}, 0
    while i < len(rest):
        if i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            out[rest[i]] = rest[i + 1]
            i += 2
        else:
            out[rest[i]] = None
            i += 1
    return out


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
    t, n, p = cfg["train"], cfg["neuron"], cfg["parallel"]
    train, comp = ((GOLDEN / f"{name}.{p}.sh").read_text() for p in ("train", "precompile"))
    flags = trainer_flags(train)
    assert not {"--pretrained_weight_dir", "--num_kept_checkpoints", "--convert_from_full_model"} & set(flags)
    zero1 = commands.script_kind(cfg) == "tp_zero1"
    assert zero1 == (p["pp"] == 1)  # NxD's tp + ZeRO-1 recipe without a pipeline, run_llama_nxd.py with one
    if zero1:
        valued = {k for k, v in flags.items() if v is not None}
        assert valued <= ZERO1_FLAGS and set(flags) - valued <= ZERO1_SWITCHES, set(flags) - ZERO1_FLAGS - ZERO1_SWITCHES
        dp = p["nproc_per_node"] * p["nnodes"] // int(flags["--tensor_parallel_size"])
        assert dp * int(flags["--batch_size"]) * int(flags["--grad_accum_usteps"]) == t["global_batch_size"]
        assert flags["--loading_step"] == "latest_if_exists" and "--pretrained_weight" in flags
        assert flags["--data_dir"] == f"{RUN}/data/views/hf/train" and flags["--model_path"] == f"{RUN}/checkpoints/init"
        assert ("--use_zero_1" in flags) == (p["zero"] == 1) and ("--use_mix_precision" in flags) == n["fp32_optimizer"]
        assert "--pipeline_parallel_size" not in flags and "--min_lr" not in flags
    else:
        assert set(flags) <= TRAINER_FLAGS, set(flags) - TRAINER_FLAGS
        dp = p["nproc_per_node"] * p["nnodes"] // (int(flags["--tensor_parallel_size"]) * int(flags["--pipeline_parallel_size"]))
        assert dp * int(flags["--train_batch_size"]) == t["global_batch_size"]
        assert int(flags["--num_microbatches"]) * t["micro_batch_size"] == int(flags["--train_batch_size"])
        assert flags["--loading_step"] == "latest_if_exists" and flags["--pretrained_weight"] == "1"
        assert flags["--training_dir"] == f"{RUN}/data/views/hf/train"
    assert flags["--kv_replicator"] == str(n["kv_size_multiplier"]) and flags["--seq_len"] == str(t["seq_len"])
    assert float(flags["--weight_decay"]) == t["weight_decay"] and float(flags["--lr"]) == t["lr"]
    # srun: one task per node; each runs llmpipe's node task (torchrun --nnodes/--node_rank from SLURM_NODEID)
    srun = shlex.split(train.strip().splitlines()[-1])
    assert srun[:6] == [
        "srun",
        "--overlap",
        "--kill-on-bad-exit=1",
        f"--nodes={p['nnodes']}",
        f"--ntasks={p['nnodes']}",
        "--ntasks-per-node=1",
    ]
    assert srun[srun.index("--master") + 1] == "trn1-1:44000"
    assert srun[srun.index("--nproc-per-node") + 1] == str(p["nproc_per_node"])
    # precompile: the same command, each node's wrapped in neuron_parallel_compile, steps cut, no saving
    pre = shlex.split(comp.strip().splitlines()[-1])
    assert pre[pre.index("--cpus-per-task=128") + 1] == "neuron_parallel_compile"
    pflags = trainer_flags(comp)
    cut = "--steps_this_run" if zero1 else "--max_steps"
    assert pflags.pop(cut) == str(n["extract_steps"]) and pflags.pop("--checkpoint_freq") == "-1"
    assert {k: v for k, v in flags.items() if k not in (cut, "--checkpoint_freq")} == pflags
    assert train.splitlines()[:-1] == comp.splitlines()[:-1]  # same environment, same compile cache
    cc = next(line for line in train.splitlines() if line.startswith("export NEURON_CC_FLAGS="))
    assert "--cache_dir=results/neuron-compile-cache" in cc and "--model-type=transformer" in cc


# Every train.* hyperparameter of the schema, changed: it reaches the trainer's flags with the value given,
# or the config is refused naming the key (what NxD hard-codes). (key, new value, flag per script or None)
HYPER = [
    ("lr", 1.0e-4, {"tp_pp": "--lr", "tp_zero1": "--lr"}),
    ("min_lr", 2.0e-6, {"tp_pp": "--min_lr", "tp_zero1": None}),
    ("warmup_steps", 7, {"tp_pp": "--warmup_steps", "tp_zero1": "--warmup_steps"}),
    ("max_steps", 20000, {"tp_pp": "--max_steps", "tp_zero1": "--max_steps"}),
    ("weight_decay", 0.05, {"tp_pp": None, "tp_zero1": "--weight_decay"}),
    ("beta1", 0.8, {"tp_pp": "--beta1", "tp_zero1": "--beta1"}),
    ("beta2", 0.98, {"tp_pp": "--beta2", "tp_zero1": "--beta2"}),
    ("eps", 1.0e-5, {"tp_pp": None, "tp_zero1": None}),
    ("grad_clip", 0.5, {"tp_pp": None, "tp_zero1": None}),
    ("seed", 99, {"tp_pp": "--seed", "tp_zero1": "--seed"}),
    ("seq_len", 2048, {"tp_pp": "--seq_len", "tp_zero1": "--seq_len"}),
    ("save_interval", 500, {"tp_pp": "--checkpoint_freq", "tp_zero1": "--checkpoint_freq"}),
    ("keep_checkpoints", 5, {"tp_pp": "--num_kept_checkpoint", "tp_zero1": "--num_kept_checkpoint"}),
    ("log_interval", 3, {"tp_pp": "--logging_interval", "tp_zero1": "--logging_interval"}),
]


@pytest.mark.parametrize("key, value, flag", HYPER, ids=[h[0] for h in HYPER])
@pytest.mark.parametrize("name", PRESETS)
def test_every_hyperparameter_reaches_the_trainer_or_is_refused(name, key, value, flag):
    cfg = preset(name, train={key: value})
    kind = commands.script_kind(cfg)
    if flag[kind] is None:
        with pytest.raises(commands.NeuronConfigError, match=f"train.{key} "):
            build(cfg, "train")
        return
    flags = trainer_flags(build(cfg, "train"))
    assert float(flags[flag[kind]]) == value, (kind, flag[kind], flags[flag[kind]])


def test_local_precompile_wraps_torchrun_and_s3_cache_uses_the_url(tmp_path):
    cfg = preset(
        "llama-2-7b-trn1",
        train={"global_batch_size": 4, "launcher": "local"},
        parallel={"nnodes": 1},
        neuron={"compile_cache": "s3://bucket/neuron-cache"},
    )
    args = commands.trainer_args(cfg, "init", "view", "ckpt", "m.json", "tb", "precompile")
    cmd = commands.command(cfg, args, None, "precompile", python="py")
    assert cmd[:6] == ["neuron_parallel_compile", "py", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
    # the wrapper of neuron.python's venv (not activated by the job), where it has one
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "neuron_parallel_compile").write_text("#!/bin/sh\n")
    cmd = commands.command(cfg, args, None, "precompile", python=str(venv / "python"))
    assert cmd[:2] == [str(venv / "neuron_parallel_compile"), str(venv / "python")]
    env = commands.environment(cfg)
    assert env["NEURON_COMPILE_CACHE_URL"] == "s3://bucket/neuron-cache" and "--cache_dir" not in env["NEURON_CC_FLAGS"]


@pytest.mark.parametrize(
    "name, over, needle",
    [
        ("llama-2-7b-trn1", dict(train={"micro_batch_size": 3}), "train.micro_batch_size 3 must divide the per-replica batch 64"),
        ("llama-2-7b-trn1", dict(train={"grad_clip": 0.5}), "clips gradients at 1.0"),
        ("llama-2-7b-trn1", dict(train={"min_lr": 3.0e-5}), "decays the learning rate linearly to 0 at max_steps: train.min_lr"),
        ("llama-2-7b-trn1", dict(train={"eps": 1.0e-8}), "uses its AdamW's eps 1e-06 (hard-coded): train.eps 1e-08"),
        ("llama-2-7b-trn1", dict(neuron={"save_xser": False}), "always saves xser checkpoints: neuron.save_xser"),
        (
            "llama-2-7b-trn1",
            dict(neuron={"script": "tp_pp"}),
            "neuron.script tp_pp (run_llama_nxd.py) cannot train at parallel.pp 1",
        ),
        ("llama-2-7b-trn1", dict(train={"max_steps": 10500}), "max_steps 10500 must be a multiple of train.save_interval 1000"),
        (
            "llama-2-7b-trn1",
            dict(train={"global_batch_size": 24}),
            "global_batch_size 24 must be a multiple of data parallelism 16",
        ),
        (
            "llama-2-7b-trn1",
            dict(parallel={"nnodes": 1, "nproc_per_node": 2}),
            "tp 8 x parallel.pp 1 must divide the 2 NeuronCores",
        ),
        ("llama-2-7b-trn1", dict(parallel={"zero": 2}), "has ZeRO-1 or none: parallel.zero 2 cannot be honoured"),
        (
            "llama-2-7b-trn1",
            dict(parallel={"activation_checkpointing": False}),
            "checkpoints selectively or every layer: parallel.activation_checkpointing False",
        ),
        (  # run_llama_nxd.py (tp_pp) too: --use_selective_checkpoint 0 is "full", every layer (NxD 2.29)
            "llama-3-70b-trn1",
            dict(parallel={"activation_checkpointing": False}),
            "run_llama_nxd.py checkpoints selectively or every layer: parallel.activation_checkpointing False",
        ),
        (
            "llama-3-70b-trn1",
            dict(train={"weight_decay": 0.1}),
            "sets weight decay 0.01 per parameter group (training_utils, hard-coded): train.weight_decay 0.1",
        ),
        ("llama-3-70b-trn1", dict(neuron={"fp32_optimizer": True}), "uses its AdamW's eps 1e-06 (hard-coded): train.eps 1e-08"),
        ("llama-3-70b-trn1", dict(neuron={"script": "tp_zero1"}), "neuron.script tp_zero1 has no pipeline"),
        ("llama-2-7b-trn1", dict(train={"precision": "fp32"}), "train.precision fp32 cannot be honoured"),
        ("llama-3-70b-trn1", dict(train={"skip_nonfinite_steps": 2}), "train.skip_nonfinite_steps 2 cannot be honoured"),
        (  # a node has so many NeuronCores: trn1 32, trn2 64 at LNC 2 (128 at LNC 1: neuron.env)
            "llama-2-7b-trn1",
            dict(parallel={"nproc_per_node": 64}),
            "parallel.nproc_per_node 64 is more processes than a trn1 node has NeuronCores (32",
        ),
        (
            "llama-3-70b-trn2",
            dict(parallel={"nproc_per_node": 128}),
            "NeuronCores (64; neuron.hw_backend; 128 at LNC 1: neuron.env",
        ),
    ],
)
def test_unmappable_settings_are_refused(name, over, needle):
    with pytest.raises(commands.NeuronConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        commands.check_config(preset(name, **over))


def test_trn2_at_lnc_1_has_128_cores():
    cfg = preset("llama-3-70b-trn2", parallel={"nproc_per_node": 128}, neuron={"env": {"NEURON_LOGICAL_NC_CONFIG": "1"}})
    assert commands.cores_per_node(cfg) == 128
    assert commands.config_problems(cfg) == []


def snakemake_n(*args, profile="profiles/slurm-trn1"):
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--profile", profile, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize("name", PRESETS)
def test_dry_run_draws_the_whole_neuron_dag(name):
    hw = preset(name)["neuron"]["hw_backend"]  # each preset on its chip's profile (the other one refuses it)
    r = snakemake_n("--configfile", f"config/presets/{name}.yaml", profile=f"profiles/slurm-{hw}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    nodes = preset(name)["parallel"]["nnodes"]
    for rule in ("init_model", "neuron_shard", "neuron_precompile", "train_neuron", "neuron_merge", "export_hf", "evaluate"):
        assert f"rule {rule}:" in out, rule
    for rule in ("neuron_precompile", "train_neuron"):
        block = out[out.index(f"rule {rule}:") :].split("\n\n")[0]
        assert f"nodes={nodes}, tasks={nodes}" in block and "slurm_extra=--exclusive" in block


def test_dry_run_stops_on_an_invalid_layout_before_any_job(tmp_path):
    over = tmp_path / "kvm.yaml"
    over.write_text("neuron: {kv_size_multiplier: 2}\n")
    r = snakemake_n("--configfile", "config/presets/llama-3-70b-trn1.yaml", str(over))
    assert r.returncode != 0
    assert "kv_size_multiplier 2 must equal tp / num_key_value_heads = 4" in r.stdout + r.stderr
