# Backend "levanter": JAX (TPU VM, pod slice, or CPU) with Levanter, in its own environment
# (levanter.python: .venvs/levanter/bin/python from scripts/setup-env-levanter.sh, or python under
# --use-conda with envs/levanter.yaml). token store -> Levanter cache -> Levanter config -> train_lm
# -> {RUN}/checkpoints/levanter/final (HF format), which the shared export and evaluate rules read.

LEVANTER_OUT = config["levanter"]["output_dir"] or f"{RUN}/checkpoints/levanter"


rule levanter_cache:
    input:
        store=f"{RUN}/data/tokens/manifest.json",
    output:
        directory(f"{RUN}/data/views/levanter"),
    log:
        f"{RUN}/logs/levanter_cache.log",
    conda:
        "../envs/levanter.yaml"
    params:
        python=config["levanter"]["python"],
    shell:
        "{params.python:q} -m llmpipe levanter-cache --store {input.store:q} --out {output:q} > {log:q} 2>&1"


rule levanter_config:
    input:
        cache=f"{RUN}/data/views/levanter",
        tokenizer=f"{RUN}/tokenizer",
        init=f"{RUN}/checkpoints/init",
    output:
        directory(f"{RUN}/train/levanter"),
    log:
        f"{RUN}/logs/levanter_config.log",
    conda:
        "../envs/levanter.yaml"
    params:
        cfg=cfg_json("run", "data.shuffle", "data.shuffle_seed", "model", "train", "parallel", "eval", "levanter"),
        python=config["levanter"]["python"],
        output=LEVANTER_OUT,
    shell:
        "{params.python:q} -m llmpipe levanter-config --config {params.cfg:q} --cache {input.cache:q}"
        " --tokenizer {input.tokenizer:q} --init {input.init:q} --output {params.output:q} --out {output:q} > {log:q} 2>&1"


rule train_levanter:
    input:
        config=f"{RUN}/train/levanter",
        cache=f"{RUN}/data/views/levanter",
    output:
        directory(f"{RUN}/checkpoints/levanter/final"),
    log:
        f"{RUN}/logs/train_levanter.log",
    conda:
        "../envs/levanter.yaml"
    threads: config["train"]["threads"]
    resources:
        **train_resources(),
    params:
        python=config["levanter"]["python"],
        platforms=config["levanter"]["jax_platforms"],
        metrics=f"{RUN}/train/metrics.jsonl",
        attempts=attempts_log("train_levanter"),
    shell:
        "{params.python:q} -m llmpipe levanter-train --levanter-config {input.config:q}/config.yaml --out {output:q}"
        " --metrics {params.metrics:q} --jax-platforms {params.platforms:q} 2>&1 | to_logs {params.attempts:q} > {log:q}"
