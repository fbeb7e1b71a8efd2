# Backend-independent tail: the backend's HF-format checkpoint -> {RUN}/hf -> {RUN}/eval.json.


rule export_hf:
    input:
        trained=f"{RUN}/checkpoints/{BACKEND}/final",
        tokenizer=f"{RUN}/tokenizer",
        manifest=f"{RUN}/data/tokens/manifest.json",
    output:
        directory(f"{RUN}/hf"),
    log:
        f"{RUN}/logs/export_hf.log",
    conda:
        "../envs/torch.yaml"
    params:
        cfg=cfg_json("export"),
    shell:
        "python -m llmpipe export --config {params.cfg:q} --trained {input.trained:q} --tokenizer {input.tokenizer:q}"
        " --manifest {input.manifest:q} --out {output:q} > {log:q} 2>&1"


rule evaluate:
    input:
        model=f"{RUN}/hf",
        data=f"{RUN}/data/views/hf",
    output:
        f"{RUN}/eval.json",
    log:
        f"{RUN}/logs/evaluate.log",
    conda:
        "../envs/torch.yaml"
    threads: 2
    params:
        cfg=cfg_json("eval", "train.document_masking", "train.backend", drop=("eval.max_batches", "eval.stream_weights")),
        # how the weights are held, not what is scored: a function of input, out of the params rerun trigger
        stream=lambda wildcards, input: str(config["eval"]["stream_weights"]).lower(),
    shell:
        "python -m llmpipe evaluate --config {params.cfg:q} --model {input.model:q} --data {input.data:q}"
        " --stream-weights {params.stream} --threads {threads} --out {output:q} > {log:q} 2>&1"
