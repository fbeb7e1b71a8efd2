# llmpipe: raw text -> token store -> packed views -> train -> HF export -> evaluation.
# Run: snakemake --profile profiles/local      Dry run: add -n      DAG: --rulegraph | dot -Tpng
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/model.smk"
include: f"rules/train_{BACKEND}.smk"
include: "rules/export.smk"


apply_config_resources()


rule all:
    input:
        f"{RUN}/data/stats.json",
        f"{RUN}/hf",
        f"{RUN}/eval.json",
    default_target: True
