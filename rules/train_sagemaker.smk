# Backend "sagemaker": data prep stays local; the view goes to S3 (sagemaker_upload), SageMaker trains
# (mode algorithm: a marketplace algorithm on the litgpt view; mode image: a PyTorch container running
# llmpipe's torch trainer on the hf view), and train_sagemaker attaches to or creates the job, waits,
# and turns model.tar.gz into {RUN}/checkpoints/sagemaker/final (HF) for the shared export / evaluate.
SM_ALGORITHM = config["sagemaker"]["mode"] == "algorithm"


rule sagemaker_upload:
    input:
        view=f"{RUN}/data/views/litgpt" if SM_ALGORITHM else f"{RUN}/data/views/hf",
        init=[] if SM_ALGORITHM else f"{RUN}/checkpoints/init",
    output:
        f"{RUN}/sagemaker/inputs.json",
    log:
        f"{RUN}/logs/sagemaker_upload.log",
    conda:
        "../envs/sagemaker.yaml"
    params:
        cfg=cfg_json("run", "data.views", "sagemaker"),
        init=lambda wildcards, input: ["--init", input.init] if input.init else [],
    shell:
        "python -m llmpipe sagemaker-upload --config {params.cfg:q} --view {input.view:q} {params.init:q}"
        " --out {output:q} > {log:q} 2>&1"


rule train_sagemaker:
    input:
        inputs=f"{RUN}/sagemaker/inputs.json",
        tokenizer=f"{RUN}/tokenizer",  # a lit-gpt artifact's config takes its BOS / EOS / PAD ids
    output:
        directory(f"{RUN}/checkpoints/sagemaker/final"),
    log:
        f"{RUN}/logs/train_sagemaker.log",
    conda:
        "../envs/sagemaker.yaml"
    params:
        # micro_batch_size stays a trigger: a marketplace algorithm's MICRO_BATCH_SIZE
        **train_cfg_json("run", "data.views", "train", "parallel", "eval", "sagemaker", keep=("train.micro_batch_size",)),
        metrics=f"{RUN}/train/metrics.jsonl",
        attempts=attempts_log("train_sagemaker"),
    shell:
        "python -m llmpipe sagemaker-train --config {params.cfg:q} --inputs {input.inputs:q} --tokenizer {input.tokenizer:q}"
        " --metrics {params.metrics:q} --out {output:q} 2>&1 | to_logs {params.attempts:q} > {log:q}"
