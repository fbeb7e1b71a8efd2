# Test backend "echo" (TEST DOUBLE): the initial model, copied, is the trained one.


rule train_echo:
    input:
        init=f"{RUN}/checkpoints/init",
        data=f"{RUN}/data/views/hf",
    output:
        directory(f"{RUN}/checkpoints/echo/final"),
    log:
        f"{RUN}/logs/train_echo.log",
    params:
        cfg=cfg_json("echo"),
    shell:
        "python -m llmpipe echo-train --config {params.cfg:q} --init {input.init:q} --out {output:q} > {log:q} 2>&1"
