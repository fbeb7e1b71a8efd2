# Backend "torch": plain PyTorch; DDP under torchrun when parallel.nproc_per_node > 1, one torchrun per node via
# srun when parallel.nnodes > 1 (llmpipe.launch picks the command at run time, inside the job).
# Contract for every backend file: produce the HF-format folder {RUN}/checkpoints/<backend>/final.


rule train_torch:
    input:
        init=f"{RUN}/checkpoints/init",
        data=f"{RUN}/data/views/hf",
        resume=rules.resume_check.output,
    output:
        directory(f"{RUN}/checkpoints/torch/final"),
    log:
        f"{RUN}/logs/train_torch.log",
    conda:
        "../envs/torch.yaml"
    threads: config["train"]["threads"] * config["parallel"]["nproc_per_node"]
    resources:
        **train_resources(),
    params:
        **train_cfg_json("train", "parallel", "eval"),
        launch=launch_prefix(),
        checkpoints=lambda wildcards, output: Path(output[0]).parent,
        metrics=f"{RUN}/train/metrics.jsonl",
        attempts=attempts_log("train_torch"),
    shell:
        "{params.launch} -- -m llmpipe torch-train"
        " --config {params.cfg:q} --init {input.init:q} --data {input.data:q} --checkpoints {params.checkpoints:q}"
        " --metrics {params.metrics:q} --out {output:q} 2>&1 | to_logs {params.attempts:q} > {log:q}"
