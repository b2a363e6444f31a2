# Generation stage: configs, then starter code; each validated task becomes an MLGym tree under tasks/<slot>/mlgym.


rule task_configs:
    input:
        proposal=f"{R}/proposals/{{slot}}.json",
    output:
        f"{R}/configs/{{slot}}.json",
    log:
        f"{LOGS}/configs/{{slot}}.log",
    params:
        digest=CFG.digest("seed", "teacher", "generation"),
    shell:
        gymforge(
            "task-configs",
            "--slot {wildcards.slot} --proposal {input.proposal} --out {output}",
        )


rule starter_code:
    input:
        proposal=f"{R}/proposals/{{slot}}.json",
        configs=f"{R}/configs/{{slot}}.json",
    output:
        status=f"{R}/tasks/{{slot}}/status.json",
        tree=directory(f"{R}/tasks/{{slot}}/mlgym"),
    log:
        f"{LOGS}/tasks/{{slot}}.log",
    benchmark:
        f"{BENCH}/tasks/{{slot}}.tsv"
    params:
        digest=CFG.digest("seed", "teacher", "datasets", "generation"),
    resources:
        mem_mb=CFG.generation.mem_mb,
        runtime=CFG.generation.runtime_min,
    shell:
        gymforge(
            "starter-code",
            "--slot {wildcards.slot} --proposal {input.proposal} --configs {input.configs} --status-out "
            "{output.status} --tree-out {output.tree}",
        )


rule tasks:
    input:
        f"{R}/config.json",
        expand(f"{R}/tasks/{{slot}}/status.json", slot=TOPIC_SLOTS),
