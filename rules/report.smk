# Items for `snakemake --report report.html`: loss, learning-rate and throughput curves, data
# statistics, the plan and the evaluation (captions in report/). Built once training and evaluation are done.


rule report_items:
    input:
        trained=f"{RUN}/checkpoints/{BACKEND}/final",
        stats=f"{RUN}/data/stats.json",
        plan=f"{RUN}/plan.json",
        eval=f"{RUN}/eval.json",
    output:
        loss=report(f"{RUN}/report/loss.png", caption="../report/loss.rst", category="Training", labels={"figure": "loss"}),
        lr=report(f"{RUN}/report/lr.png", caption="../report/lr.rst", category="Training", labels={"figure": "learning rate"}),
        throughput=report(
            f"{RUN}/report/throughput.png",
            caption="../report/throughput.rst",
            category="Training",
            labels={"figure": "throughput"},
        ),
        data=report(f"{RUN}/report/data.html", caption="../report/data.rst", category="Data", labels={"table": "data statistics"}),
        plan=report(f"{RUN}/report/plan.html", caption="../report/plan.rst", category="Plan", labels={"table": "plan"}),
        eval=report(
            f"{RUN}/report/eval.html", caption="../report/eval.rst", category="Evaluation", labels={"table": "evaluation"}
        ),
    log:
        f"{RUN}/logs/report_items.log",
    conda:
        "../envs/torch.yaml"
    params:
        metrics=f"{RUN}/train/metrics.jsonl",
        out=lambda wildcards, output: Path(output.loss).parent,
    shell:
        "python -m llmpipe report --metrics {params.metrics:q} --stats {input.stats:q} --plan {input.plan:q}"
        " --eval {input.eval:q} --out {params.out:q} > {log:q} 2>&1"
