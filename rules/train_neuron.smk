# Backend "neuron": AWS Trainium with neuronx-distributed's Llama trainer (run_llama_nxd.py, tp/pp).
# init (HF) -> neuron_shard (NxD pretrained_weight rank files) -> neuron_precompile (graphs into the
# shared compile cache) -> train_neuron (srun + torchrun per node) -> neuron_merge ->
# {RUN}/checkpoints/neuron/final (HF), which the shared export_hf / evaluate rules read.
NXD = f"{RUN}/checkpoints/neuron/nxd"  # run_llama_nxd.py --checkpoint_dir: pretrained_weight/, step_<N>/
NEURON_LAYOUT = [
    "parallel.tp",
    "parallel.pp",
    *(f"neuron.{k}" for k in ("vpp", "kv_size_multiplier", "qkv_linear", "fuse_qkv", "coalesce_qkv", "hw_backend")),
]
NEURON_RUN = ("results_dir", "model.init_from", "train", "parallel", "neuron")
# neuron.* keys that change how a run is launched or compiled, not the trained model: left out of
# train_neuron's rerun trigger (precompile keeps all but master_port: its graphs and the cache they go to;
# when it reruns, training follows through its new marker, finds a finished run and launches nothing).
# Not ancient(): Snakemake 9.27.1 then skips a dependent's own params check while its input's job reruns.
NEURON_LAUNCH = tuple(f"neuron.{k}" for k in ("extract_steps", "master_port", "python", "nxd_dir", "compile_cache"))


rule neuron_shard:
    input:
        init=f"{RUN}/checkpoints/init",
    output:
        directory(f"{NXD}/pretrained_weight"),
    log:
        f"{RUN}/logs/neuron_shard.log",
    conda:
        "../envs/torch.yaml"
    params:
        layout=cfg_json(*NEURON_LAYOUT),
        ckpt=lambda wildcards, output: Path(output[0]).parent,  # the NxD checkpoint dir
    shell:
        "python -m llmpipe neuron-shard --model {input.init:q} --out {params.ckpt:q} --layout {params.layout:q} > {log:q} 2>&1"


# Same nodes, flags and compile cache as train_neuron; the marker records the cache and the compiler
# flags, so a changed flag (a params change) runs it again.
rule neuron_precompile:
    input:
        init=f"{RUN}/checkpoints/init",
        data=f"{RUN}/data/views/hf",
        shards=f"{NXD}/pretrained_weight",
    output:
        f"{RUN}/checkpoints/neuron/precompile.json",
    log:
        f"{RUN}/logs/neuron_precompile.log",
    conda:
        "../envs/torch.yaml"
    resources:
        **train_resources(),
    params:
        **train_cfg_json(*NEURON_RUN, keep=("train.micro_batch_size",), neutral=("neuron.master_port",)),  # graph shapes
        ckpt=lambda wildcards, input: Path(input.shards).parent,
        metrics=f"{RUN}/train/nxd_precompile_metrics.json",
        attempts=attempts_log("neuron_precompile"),
        tb=f"{RUN}/train/tensorboard_precompile",
    shell:
        "python -m llmpipe neuron-precompile --config {params.cfg:q} --init {input.init:q} --data {input.data:q}"
        " --checkpoint-dir {params.ckpt:q} --metrics {params.metrics:q} --tb-dir {params.tb:q} --out {output:q} 2>&1 | to_logs {params.attempts:q} > {log:q}"


rule train_neuron:
    input:
        init=f"{RUN}/checkpoints/init",
        data=f"{RUN}/data/views/hf",
        shards=f"{NXD}/pretrained_weight",
        compiled=f"{RUN}/checkpoints/neuron/precompile.json",
    output:
        f"{RUN}/checkpoints/neuron/train.json",
    log:
        f"{RUN}/logs/train_neuron.log",
    conda:
        "../envs/torch.yaml"
    resources:
        **train_resources(),
    params:
        **train_cfg_json(*NEURON_RUN, neutral=NEURON_LAUNCH),
        ckpt=lambda wildcards, input: Path(input.shards).parent,
        metrics=f"{RUN}/train/nxd_metrics.json",
        attempts=attempts_log("train_neuron"),
        tb=f"{RUN}/train/tensorboard",
    shell:
        "python -m llmpipe neuron-train --config {params.cfg:q} --init {input.init:q} --data {input.data:q}"
        " --checkpoint-dir {params.ckpt:q} --metrics {params.metrics:q} --tb-dir {params.tb:q} --out {output:q} 2>&1 | to_logs {params.attempts:q} > {log:q}"


rule neuron_merge:
    input:
        trained=f"{RUN}/checkpoints/neuron/train.json",
        shards=f"{NXD}/pretrained_weight",
        tokenizer=f"{RUN}/tokenizer",
    output:
        directory(f"{RUN}/checkpoints/neuron/final"),
    log:
        f"{RUN}/logs/neuron_merge.log",
    conda:
        "../envs/torch.yaml"
    params:
        ckpt=lambda wildcards, input: Path(input.shards).parent,
    shell:
        "python -m llmpipe neuron-merge --checkpoint-dir {params.ckpt:q} --tokenizer {input.tokenizer:q} --step latest"
        " --dtype bfloat16 --out {output:q} > {log:q} 2>&1"
