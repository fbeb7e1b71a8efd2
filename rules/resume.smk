# Before a trainer that resumes from llmpipe.train checkpoints (torch, colossal): a job of its own that
# refuses checkpoints trained on another data view or initial model, so the old trained model is not
# deleted first (Snakemake deletes the training job's output before running it).


rule resume_check:
    input:
        init=f"{RUN}/checkpoints/init",
        data=f"{RUN}/data/views/hf",
    output:
        f"{RUN}/train/resume-check.json",
    log:
        f"{RUN}/logs/resume_check.log",
    conda:
        "../envs/torch.yaml"
    params:
        checkpoints=f"{RUN}/checkpoints/{BACKEND}",
        run=config["run"],
        resume=[] if config["train"]["resume"] else ["--no-resume"],
    shell:
        "python -m llmpipe resume-check --checkpoints {params.checkpoints:q} --init {input.init:q} --data {input.data:q}"
        " --run {params.run:q} {params.resume:q} --out {output:q} > {log:q} 2>&1"
