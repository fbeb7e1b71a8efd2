# Backend "colossal": ColossalAI Booster (gemini, gemini_auto, zero2, 3d, ddp) in its own environment
# (colossal.python: .venvs/colossal/bin/python from scripts/setup-env-colossal.sh, or python under
# --use-conda with envs/colossal.yaml). Launch: llmpipe.launch (python / torchrun on one node, srun +
# torchrun per node under Slurm) or `colossalai run --hostfile` (colossal.launcher: colossalai).
# Contract: produce the HF-format folder {RUN}/checkpoints/colossal/final.

from llmpipe.backends.colossal.checks import TRAIN_KEYS as COLOSSAL_TRAIN_KEYS


rule train_colossal:
    input:
        init=f"{RUN}/checkpoints/init",
        data=f"{RUN}/data/views/hf",
        tokenizer=f"{RUN}/tokenizer",
        resume=rules.resume_check.output,
        hostfile=(
            [config["colossal"]["hostfile"]]
            if config["colossal"]["launcher"] == "colossalai" and config["colossal"]["hostfile"]
            else []
        ),
    output:
        directory(f"{RUN}/checkpoints/colossal/final"),
    log:
        f"{RUN}/logs/train_colossal.log",
    conda:
        "../envs/colossal.yaml"
    threads: config["train"]["threads"] * config["parallel"]["nproc_per_node"]
    resources:
        **train_resources(),
    params:
        **train_cfg_json("train", "parallel", "eval", *[f"colossal.{k}" for k in COLOSSAL_TRAIN_KEYS]),
        launch=colossal_launch(),
        cfg_file=f"{RUN}/train/colossal-config.json",
        checkpoints=lambda wildcards, output: Path(output[0]).parent,
        metrics=f"{RUN}/train/metrics.jsonl",
        attempts=attempts_log("train_colossal"),
    shell:
        # The config goes through a file: `colossalai run` joins arguments into one shell line.
        "mkdir -p $(dirname {params.cfg_file:q}) && printf '%s' {params.cfg:q} > {params.cfg_file:q} && "
        "{params.launch} llmpipe colossal-train --config {params.cfg_file:q} --init {input.init:q} --data {input.data:q}"
        " --tokenizer {input.tokenizer:q} --checkpoints {params.checkpoints:q} --metrics {params.metrics:q} --out {output:q}"
        " 2>&1 | to_logs {params.attempts:q} > {log:q}"
