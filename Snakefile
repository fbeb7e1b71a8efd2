# llmpipe: raw text -> token store -> packed views -> train -> HF export -> evaluation.
# Run: snakemake --profile local (or slurm-trn1, gpu-colossal, tpu, sagemaker)   Dry run: add -n
# Planning DAG: llmpipe dag --profile slurm-trn1      Plan only: snakemake --profile local results/default/plan.json
# Report after a run: snakemake --report report.html
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/model.smk"
include: "rules/resume.smk"
include: BACKEND_RULES
include: "rules/export.smk"
include: "rules/plan.smk"
include: "rules/report.smk"
include: "rules/hub.smk"


check_profile_resources()
apply_config_resources()
check_slurm_extra()
check_train_gpus()
check_local_sources()
write_dag_info()  # only for `llmpipe dag` (LLMPIPE_DAG_INFO)


rule all:
    default_target: True
    input:
        f"{RUN}/data/stats.json",
        f"{RUN}/hf",
        f"{RUN}/eval.json",
        f"{RUN}/plan.json",
        rules.report_items.output,
        [f"{RUN}/release.json"] if config["hub"]["release"]["enabled"] else [],
