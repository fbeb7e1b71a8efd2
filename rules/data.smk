# sources -> tokenizer -> token store (tokenize: jobs of data.shards_per_job shards; token_store: gather)
# -> views (hf, litgpt, megatron) -> verify (token conservation, stats with sha256 of every file).


# data keys only pack and verify read: the steps before them are not given them, so a change there reruns
# only what reads it (tests/test_workflow.py)
VIEW_ONLY = tuple(f"data.{k}" for k in (*VIEW_KEYS, "views", "verify_sample"))
# ... and those only the tokenize jobs read (get_data reads every source of a mixture to count its groups;
# a trained tokenizer reads val_fraction too: it leaves validation documents out)
TOKENIZE_ONLY = tuple(f"data.{k}" for k in ("shards_per_job", "min_shards_per_job", "add_bos", "long_pretoken"))


rule get_data:
    input:
        corpus_files,
    output:
        f"{RUN}/data/sources.json",
    log:
        f"{RUN}/logs/get_data.log",
    conda:
        "../envs/torch.yaml"
    threads: GET_DATA_THREADS
    params:
        cfg=cfg_json("data", drop=(*VIEW_ONLY, *TOKENIZE_ONLY, "data.val_fraction")),
        files=corpus_stat,  # size, mtime, ctime, inode: an edit that keeps the mtime still reruns it
        remote=corpus_remote,  # ETag / version id of objects, commit of Hub datasets, as listed now
    shell:
        "python -m llmpipe get-data --config {params.cfg:q} --threads {threads} --out {output:q} > {log:q} 2>&1"


rule tokenizer:
    input:
        tokenizer_inputs,
    output:
        directory(f"{RUN}/tokenizer"),
    log:
        f"{RUN}/logs/tokenizer.log",
    localrule: is_hub_ref(config["tokenizer"]["source"])  # a Hub download runs where the network is
    conda:
        "../envs/torch.yaml"
    params:
        # data only for a tokenizer trained on it; tokenizer.backend picks the encoder of the same ids (tokenize)
        cfg=cfg_json(
            *(["data"] if config["tokenizer"]["source"] == "train" else []),
            "tokenizer",
            *(["hub.cache_dir", "hub.endpoint"] if is_hub_ref(config["tokenizer"]["source"]) else []),
            drop=(*VIEW_ONLY, *TOKENIZE_ONLY, "tokenizer.backend"),
        ),
        sources=lambda wildcards, input: (["--sources", input[0]] if config["tokenizer"]["source"] == "train" else []),
    shell:
        "python -m llmpipe tokenizer --config {params.cfg:q} {params.sources:q} --out {output:q} > {log:q} 2>&1"


rule tokenize:
    input:
        sources=f"{RUN}/data/sources.json",
        tokenizer=f"{RUN}/tokenizer",
    output:
        directory(f"{RUN}/data/tokens/job-{{job}}"),  # its shard-XXXXX.safetensors, written in parallel
    log:
        f"{RUN}/logs/tokenize/job-{{job}}.log",
    conda:
        "../envs/torch.yaml"
    threads: TOKENIZE_THREADS
    params:
        cfg=cfg_json("data", "tokenizer.backend", drop=VIEW_ONLY),
        per_job=SHARDS_PER_JOB,
    shell:
        "python -m llmpipe tokenize --config {params.cfg:q} --sources {input.sources:q} --job {wildcards.job:q}"
        " --shards-per-job {params.per_job} --tokenizer {input.tokenizer:q} --threads {threads} --out {output:q} > {log:q} 2>&1"


rule token_store:
    input:
        shards=expand(f"{RUN}/data/tokens/job-{{job}}", job=TOKENIZE_JOBS),
        sources=f"{RUN}/data/sources.json",
    output:
        f"{RUN}/data/tokens/manifest.json",
    log:
        f"{RUN}/logs/token_store.log",
    conda:
        "../envs/torch.yaml"
    shell:
        "python -m llmpipe token-store --shards {input.shards:q} --sources {input.sources:q} --out {output:q} > {log:q} 2>&1"


rule pack_view:
    input:
        store=f"{RUN}/data/tokens/manifest.json",
        tokenizer=f"{RUN}/tokenizer",
    output:
        directory(f"{RUN}/data/views/{{fmt}}"),
    log:
        f"{RUN}/logs/pack_{{fmt}}.log",
    wildcard_constraints:
        fmt="hf|litgpt|megatron",
    conda:
        "../envs/torch.yaml"
    params:
        cfg=view_cfg,
    shell:
        "python -m llmpipe pack --config {params.cfg:q} --store {input.store:q} --format {wildcards.fmt:q}"
        " --tokenizer {input.tokenizer:q} --out {output:q} > {log:q} 2>&1"


rule verify_data:
    input:
        store=f"{RUN}/data/tokens/manifest.json",
        views=expand(f"{RUN}/data/views/{{fmt}}", fmt=VIEWS),
        tokenizer=f"{RUN}/tokenizer",
        sources=f"{RUN}/data/sources.json",
    output:
        f"{RUN}/data/stats.json",
    log:
        f"{RUN}/logs/verify_data.log",
    conda:
        "../envs/torch.yaml"
    params:
        cfg=cfg_json("data", drop=UNBUILT),
        sample=config["data"]["verify_sample"],
    shell:
        "python -m llmpipe verify --config {params.cfg:q} --store {input.store:q} --views {input.views:q}"
        " --tokenizer {input.tokenizer:q} --sources {input.sources:q} --sample {params.sample:q} --out {output:q}"
        " > {log:q} 2>&1"
