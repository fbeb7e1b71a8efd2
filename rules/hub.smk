# Hugging Face Hub in and out (llmpipe.hub): a Hub base model -> checkpoints/base (init_model reads
# it); hub.datasets -> data/hub/<name>.parquet; the release folder (model card) and its upload (opt-in:
# in rule all only with hub.release.enabled). Downloads and uploads run on the submitting host
# (localrule), where the network and the user's HF token are.
import re


rule download_model:
    output:
        directory(HUB_BASE),
    log:
        f"{RUN}/logs/download_model.log",
    localrule: True
    conda:
        "../envs/torch.yaml"
    params:
        cfg=cfg_json("model.init_from", "hub.revision", "hub.allow_patterns", "hub.cache_dir", "hub.endpoint"),
    shell:
        "python -m llmpipe download-model --config {params.cfg:q} --out {output:q} > {log:q} 2>&1"


rule download_dataset:
    output:
        f"{RUN}/data/hub/{{name}}.parquet",
    log:
        f"{RUN}/logs/download_dataset/{{name}}.log",
    wildcard_constraints:
        name="|".join(re.escape(n) for n in HUB_DATASETS) or "(?!)",
    localrule: True
    conda:
        "../envs/torch.yaml"
    params:
        cfg=cfg_json("hub.datasets", "hub.endpoint", "data.text_field"),
        commit=dataset_commit,  # where the revision points now: a moved branch downloads again
    shell:
        "python -m llmpipe download-dataset --config {params.cfg:q} --name {wildcards.name:q} --out {output:q} > {log:q} 2>&1"


rule model_card:
    input:
        hf=f"{RUN}/hf",
        manifest=f"{RUN}/data/tokens/manifest.json",
        sources=f"{RUN}/data/sources.json",
        eval=f"{RUN}/eval.json",
        trained=f"{RUN}/checkpoints/{BACKEND}/final",
        view=f"{RUN}/data/views/hf",
        base=lambda wildcards: [HUB_BASE] if is_hub_ref(config["model"]["init_from"]) else [],
    output:
        directory(f"{RUN}/release"),
    log:
        f"{RUN}/logs/model_card.log",
    conda:
        "../envs/torch.yaml"
    params:
        cfg=cfg_json(*sorted(config)),  # the card states the whole config
        metrics=f"{RUN}/train/metrics.jsonl",
        base=lambda wildcards, input: ["--base", input.base[0]] if input.base else [],
    shell:
        "python -m llmpipe model-card --config {params.cfg:q} --hf {input.hf:q} --manifest {input.manifest:q}"
        " --sources {input.sources:q} --metrics {params.metrics:q} --eval {input.eval:q}"
        " --summary {input.trained:q}/train_summary.json --data-view {input.view:q} {params.base:q} --out {output:q} > {log:q} 2>&1"


rule release:
    input:
        f"{RUN}/release",
    output:
        f"{RUN}/release.json",
    log:
        f"{RUN}/logs/release.log",
    localrule: True
    conda:
        "../envs/torch.yaml"
    params:
        cfg=cfg_json("hub"),
    shell:
        "python -m llmpipe release --config {params.cfg:q} --folder {input:q} --out {output:q} > {log:q} 2>&1"
