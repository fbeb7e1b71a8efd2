# Backend "levanter": JAX (TPU VM, pod slice, or CPU) with Levanter, in its own environment
# (levanter.python: .venvs/levanter/bin/python from scripts/setup-env-levanter.sh, or python under
# --use-conda with envs/levanter.yaml). token store -> Levanter cache; train_levanter writes the Levanter
# config ({RUN}/train/levanter) and runs train_lm -> {RUN}/checkpoints/levanter/final (HF format), which
# the shared export and evaluate rules read. One job for both: train_cfg_json's rerun trigger then leaves
# out the settings that do not change the model (as a separate config job's new output would not).

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


rule train_levanter:
    input:
        cache=f"{RUN}/data/views/levanter",
        tokenizer=f"{RUN}/tokenizer",
        init=f"{RUN}/checkpoints/init",
    output:
        final=directory(f"{RUN}/checkpoints/levanter/final"),
        config=directory(f"{RUN}/train/levanter"),
    log:
        f"{RUN}/logs/train_levanter.log",
    conda:
        "../envs/levanter.yaml"
    threads: config["train"]["threads"]
    resources:
        **train_resources(),
    params:
        **train_cfg_json(
            "run",
            "data.shuffle",
            "data.shuffle_seed",
            "model",
            "train",
            "parallel",
            "eval",
            "levanter",
            neutral=("levanter.save_minutes",),
        ),
        python=config["levanter"]["python"],
        platforms=config["levanter"]["jax_platforms"],
        output=LEVANTER_OUT,
        metrics=f"{RUN}/train/metrics.jsonl",
        attempts=attempts_log("train_levanter"),
    shell:
        "{params.python:q} -m llmpipe levanter-train --config {params.cfg:q} --cache {input.cache:q}"
        " --tokenizer {input.tokenizer:q} --init {input.init:q} --output {params.output:q} --workdir {output.config:q}"
        " --out {output.final:q} --metrics {params.metrics:q} --jax-platforms {params.platforms:q}"
        " 2>&1 | to_logs {params.attempts:q} > {log:q}"
