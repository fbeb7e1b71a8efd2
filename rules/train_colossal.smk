# Backend "colossal": ColossalAI Booster (gemini, gemini_auto, zero2, 3d, ddp) in its own environment
# (colossal.python: .venvs/colossal/bin/python from scripts/setup-env-colossal.sh, or python under
# --use-conda with envs/colossal.yaml). Launch: llmpipe.launch (python / torchrun on one node, srun +
# torchrun per node under Slurm) or `colossalai run --hostfile` (colossal.launcher: colossalai).
# Contract: produce the HF-format folder {RUN}/checkpoints/colossal/final.


def colossal_launch():
    c, t = config["colossal"], config["train"]
    py = c["python"]
    if c["launcher"] == "colossalai":
        # colossalai run starts `torchrun` from PATH on every host, with this environment.
        hosts = f" --hostfile {c['hostfile']}" if c["hostfile"] else ""
        return (f'bin=$({py} -c "import os, sys; print(os.path.dirname(sys.executable))"); PATH=$bin:$PATH'
                f" $bin/colossalai run --nproc_per_node {t['nproc']}{hosts} --master_port {c['master_port']} -m")
    # launch_prefix() runs `python -m llmpipe launch`; the environment's interpreter runs it instead,
    # so torchrun (and srun's per-node launch) start that interpreter.
    return launch_prefix().replace("python ", f"{py} ", 1) + " -- -m"


rule train_colossal:
    input:
        init=f"{RUN}/checkpoints/init",
        data=f"{RUN}/data/views/hf",
        tokenizer=f"{RUN}/tokenizer",
    output:
        directory(f"{RUN}/checkpoints/colossal/final"),
    params:
        cfg=cfg_json("train", "eval", "colossal"),
        launch=colossal_launch(),
        cfg_file=f"{RUN}/train/colossal-config.json",
        checkpoints=lambda wildcards, output: Path(output[0]).parent,
        metrics=f"{RUN}/train/metrics.jsonl",
    threads: config["train"]["threads"] * config["train"]["nproc"]
    resources:
        **train_resources(),
    log:
        f"{RUN}/logs/train_colossal.log",
    conda:
        "../envs/colossal.yaml"
    shell:
        # The config goes through a file: `colossalai run` joins arguments into one shell line.
        "mkdir -p $(dirname {params.cfg_file}) && printf '%s' {params.cfg:q} > {params.cfg_file} && "
        "{params.launch} llmpipe train-colossal --config {params.cfg_file} --init {input.init} --data {input.data}"
        " --tokenizer {input.tokenizer} --checkpoints {params.checkpoints} --metrics {params.metrics} --out {output}"
        " > {log} 2>&1"
