# Initial checkpoint: a new Llama from config/ sizes, or a local base model (continued pre-training).


rule init_model:
    input:
        tokenizer=f"{RUN}/tokenizer",
        base=base_model_files,
    output:
        directory(f"{RUN}/checkpoints/init"),
    log:
        f"{RUN}/logs/init_model.log",
    conda:
        "../envs/torch.yaml"
    params:
        cfg=init_cfg_json("model", "train.seq_len", "train.seed"),
    shell:
        "python -m llmpipe init-model --config {params.cfg:q} --tokenizer {input.tokenizer:q} --out {output:q} > {log:q} 2>&1"
