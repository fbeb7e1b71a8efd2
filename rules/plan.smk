# Plan before you spend: tokens counted after packing, steps, FLOPs, time, cost and memory per
# hardware option -> {RUN}/plan.json + plan.md. Ready as soon as the view and the init checkpoint
# are; `snakemake <results>/<run>/plan.json` stops there, before training.


rule plan:
    input:
        view=f"{RUN}/data/views/hf",
        init=f"{RUN}/checkpoints/init",
        hardware=lambda wildcards: [config["plan"]["hardware_file"]] if config["plan"]["hardware_file"] else [],
    output:
        json=f"{RUN}/plan.json",
        md=f"{RUN}/plan.md",
    log:
        f"{RUN}/logs/plan.log",
    priority: 10
    # here, on the submitting host: the run's executor, the training rule's runtime and retries are this
    # process's settings (a Slurm job's snakemake has neither); the plan only reads view.json and headers
    localrule: True
    conda:
        "../envs/torch.yaml"
    params:
        # the whole config is checked here (backend checks read model, data.views, ...): every section they read
        cfg=cfg_json(
            "run",
            "model",
            "tokenizer",
            "data",
            "train",
            "parallel",
            "plan",
            *[BACKEND] if BACKEND in config else [],
            drop=("data.verify_sample", *UNBUILT),
        ),
        time_limit=train_time_limit,
    shell:
        "python -m llmpipe plan --config {params.cfg:q} --view {input.view:q} --model {input.init:q}"
        " --out {output.json:q} --markdown {output.md:q} {params.time_limit} > {log:q} 2>&1"
