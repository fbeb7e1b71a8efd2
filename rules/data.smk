# corpus -> raw shards -> tokenizer -> token store (tokenize scatter, manifest gather) -> hf view.


rule get_data:
    input:
        corpus_files,
    output:
        shards=expand(f"{RUN}/data/raw/{{shard}}.parquet", shard=SHARDS),
        manifest=f"{RUN}/data/raw/manifest.json",
    params:
        cfg=cfg_json("data"),
        out=lambda wildcards, output: Path(output.manifest).parent,
    log:
        f"{RUN}/logs/get_data.log",
    conda:
        "../envs/torch.yaml"
    shell:
        "python -m llmpipe get-data --config {params.cfg:q} --out {params.out} > {log} 2>&1"


rule tokenizer:
    input:
        tokenizer_inputs,
    output:
        directory(f"{RUN}/tokenizer"),
    params:
        cfg=cfg_json("tokenizer"),
    log:
        f"{RUN}/logs/tokenizer.log",
    conda:
        "../envs/torch.yaml"
    shell:
        "python -m llmpipe tokenizer --config {params.cfg:q} --shards {input} --out {output} > {log} 2>&1"


rule tokenize:
    input:
        shard=f"{RUN}/data/raw/{{shard}}.parquet",
        tokenizer=f"{RUN}/tokenizer",
    output:
        f"{RUN}/data/tokens/{{shard}}.safetensors",
    params:
        cfg=cfg_json("data"),
    log:
        f"{RUN}/logs/tokenize/{{shard}}.log",
    conda:
        "../envs/torch.yaml"
    shell:
        "python -m llmpipe tokenize --config {params.cfg:q} --shard {input.shard} --tokenizer {input.tokenizer}"
        " --out {output} > {log} 2>&1"


rule token_store:
    input:
        expand(f"{RUN}/data/tokens/{{shard}}.safetensors", shard=SHARDS),
    output:
        f"{RUN}/data/tokens/manifest.json",
    log:
        f"{RUN}/logs/token_store.log",
    conda:
        "../envs/torch.yaml"
    shell:
        "python -m llmpipe token-store --shards {input} --out {output} > {log} 2>&1"


rule pack_hf:
    input:
        f"{RUN}/data/tokens/manifest.json",
    output:
        directory(f"{RUN}/data/views/hf"),
    params:
        cfg=cfg_json("data", "train"),
    log:
        f"{RUN}/logs/pack_hf.log",
    conda:
        "../envs/torch.yaml"
    shell:
        "python -m llmpipe pack --config {params.cfg:q} --store {input} --out {output} > {log} 2>&1"
